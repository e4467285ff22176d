#include "tokenizer/jinja/template.h"

#include <cmath>
#include <ctime>
#include <optional>

#include "base/error.h"
#include "tokenizer/jinja/builtins.h"

namespace astrai::tokenizer::jinja {

namespace {

constexpr const char* kLineTag = "(template line ";
// jinja's sandbox refuses ranges longer than this.
constexpr int64_t kMaxRange = 100000;
// Bounds that keep hostile templates from exhausting memory or the stack (Python would raise
// MemoryError / RecursionError).
constexpr size_t kMaxRepeat = size_t{1} << 26;
constexpr int kMaxCallDepth = 256;

[[noreturn]] void undefined_error(const Value& u) {
  if (u.str_ref().empty()) fail("jinja: value is undefined");
  fail("jinja: '", u.str_ref(), "' is undefined");
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    bool flt = a.is_float() || b.is_float();
    if (op == "/") {
      if (b.as_float() == 0) fail("jinja: division by zero");
      return Value(a.as_float() / b.as_float());
    }
    if (flt) {
      double x = a.as_float(), y = b.as_float();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") return Value(std::pow(x, y));
      if (y == 0) fail("jinja: float division by zero");
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
    } else {
      int64_t x = a.as_int(), y = b.as_int(), r = 0;
      // Python ints are unbounded; ours are 64-bit, so overflow is an error, never UB.
      auto overflow = [&]() -> Value { fail("jinja: integer overflow in ", op, " (64-bit integers)"); };
      if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow() : Value(r);
      if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow() : Value(r);
      if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow() : Value(r);
      if (op == "**") {
        if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t base = x;
        r = 1;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return overflow();
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
        }
        return Value(r);
      }
      if (y == 0) fail("jinja: integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return overflow();
      if (op == "//") return Value(floor_div(x, y));
      if (op == "%") return Value(x - floor_div(x, y) * y);
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup())
        return Value::markup((a.is_markup() ? a.str_ref() : html_escape(a.str_ref())) +
                             (b.is_markup() ? b.str_ref() : html_escape(b.str_ref())));
      return Value(a.str_ref() + b.str_ref());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.list_ref();
      items.insert(items.end(), b.list_ref().begin(), b.list_ref().end());
      return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
  }
  if (op == "*") {
    const Value* seq = a.is_int() ? &b : &a;
    const Value* n = a.is_int() ? &a : &b;
    if (n->is_int() && (seq->is_string() || seq->is_list())) {
      int64_t k = std::max<int64_t>(0, n->as_int());
      size_t unit = seq->is_string() ? seq->str_ref().size() : seq->list_ref().size();
      if (unit != 0 && k > static_cast<int64_t>(kMaxRepeat / unit))
        fail("jinja: repetition result too large (limit ", kMaxRepeat, " elements/bytes)");
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < k; ++i) out += seq->str_ref();
        return Value(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < k; ++i) items.insert(items.end(), seq->list_ref().begin(), seq->list_ref().end());
      return seq->is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
  }
  if (op == "%" && a.is_string()) {
    Args args;
    if (b.is_tuple())
      args.positional = b.list_ref();
    else
      args.positional.push_back(b);
    return Value(python_percent_format(a.str_ref(), args.positional));
  }
  fail("jinja: unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string())
        fail("jinja: 'in <string>' requires string as left operand, not ", item.type_name());
      return container.str_ref().find(item.str_ref()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& v : container.list_ref())
        if (values_equal(v, item)) return true;
      return false;
    case Value::Kind::kDict: encode_key(item); return dict_find(container.dict_ref(), item) != nullptr;
    case Value::Kind::kGenerator:
      for (const auto& v : container.list_ref())
        if (values_equal(v, item)) return true;
      return false;
    case Value::Kind::kUndefined: return false;
    default: fail("jinja: argument of type '", container.type_name(), "' is not iterable");
  }
}

int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto opt_int = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail("jinja: slice ", what, " must be an integer, got ", v.type_name());
    return v.as_int();
  };
  std::optional<int64_t> start = opt_int(start_v, "start"), stop = opt_int(stop_v, "stop"),
                         step_o = opt_int(step_v, "step");
  int64_t step = step_o.value_or(1);
  if (step == 0) fail("jinja: slice step cannot be zero");
  std::vector<std::string> chars;
  const std::vector<Value>* items = nullptr;
  int64_t n;
  if (obj.is_string()) {
    chars = utf8_chars(obj.str_ref());
    n = static_cast<int64_t>(chars.size());
  } else if (obj.is_list()) {
    items = &obj.list_ref();
    n = static_cast<int64_t>(items->size());
  } else if (obj.is_undefined()) {
    undefined_error(obj);
  } else {
    fail("jinja: '", obj.type_name(), "' object is not subscriptable");
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t lo = adjust(start, step < 0 ? n - 1 : 0);
  int64_t hi = adjust(stop, step < 0 ? -1 : n);
  std::vector<int64_t> idx;
  if (step > 0)
    for (int64_t i = lo; i < hi; i += step) idx.push_back(i);
  else
    for (int64_t i = lo; i > hi; i += step) idx.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) out += chars[i];
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i : idx) out.push_back((*items)[i]);
  return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

std::string strftime_now(const std::string& fmt) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[512];
  size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
  if (n == 0 && !fmt.empty()) fail("jinja: strftime_now: format too long or empty result");
  return std::string(buf, n);
}

std::shared_ptr<Frame> make_globals() {
  auto g = std::make_shared<Frame>();
  g->vars["range"] = Value::callable("range", [](Interpreter&, Args& a) {
    if (!a.keyword.empty()) fail("jinja: range() takes no keyword arguments");
    std::vector<int64_t> p;
    for (const auto& v : a.positional) {
      if (!v.is_int() && !v.is_bool()) fail("jinja: range() arguments must be integers, got ", v.type_name());
      p.push_back(v.as_int());
    }
    int64_t start = 0, stop, step = 1;
    if (p.size() == 1) {
      stop = p[0];
    } else if (p.size() == 2 || p.size() == 3) {
      start = p[0];
      stop = p[1];
      if (p.size() == 3) step = p[2];
    } else {
      fail("jinja: range expected 1 to 3 arguments, got ", p.size());
    }
    if (step == 0) fail("jinja: range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) fail("jinja: range too big (sandbox limit ", kMaxRange, ")");
      out.emplace_back(i);
    }
    return Value::list(std::move(out));
  });
  auto make_dict = [](Args& a, bool ns) {
    Value d = ns ? Value::ns() : Value::dict();
    for (const auto& v : a.positional) {
      if (v.is_dict()) {
        for (const auto& [k, x] : v.dict_ref().items()) d.dict_mut().set(k, x);
      } else if (v.is_list()) {
        for (const auto& pair : v.list_ref()) {
          if (!pair.is_list() || pair.list_ref().size() != 2 || !pair.list_ref()[0].is_string())
            fail("jinja: dict() sequence elements must be (str, value) pairs");
          d.dict_mut().set(pair.list_ref()[0].str_ref(), pair.list_ref()[1]);
        }
      } else {
        fail("jinja: cannot convert '", v.type_name(), "' to a dict");
      }
    }
    for (auto& [k, v] : a.keyword) d.dict_mut().set(k, v);
    return d;
  };
  g->vars["dict"] = Value::callable("dict", [make_dict](Interpreter&, Args& a) { return make_dict(a, false); });
  g->vars["namespace"] = Value::callable("namespace", [make_dict](Interpreter&, Args& a) { return make_dict(a, true); });
  g->vars["raise_exception"] = Value::callable("raise_exception", [](Interpreter&, Args& a) -> Value {
    std::string msg = a.positional.empty() ? "" : a.positional[0].to_str();
    fail("jinja: raise_exception: ", msg);
  });
  g->vars["strftime_now"] = Value::callable("strftime_now", [](Interpreter&, Args& a) {
    Value fmt = arg_or(a, 0, "format", Value(""));
    if (!fmt.is_string()) fail("jinja: strftime_now() expects a format string");
    return Value(strftime_now(fmt.str_ref()));
  });
  return g;
}

}  // namespace

const Value* Frame::lookup(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: undefined_error(obj);
    case Value::Kind::kNamespace: {
      const Value* v = obj.dict_ref().find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Kind::kDict: {
      Value m = get_method(obj, name);
      if (!m.is_undefined()) return m;
      const Value* v = obj.dict_ref().find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Kind::kString:
    case Value::Kind::kList: {
      Value m = get_method(obj, name);
      return m.is_undefined() ? Value::undefined(name) : m;
    }
    default: return Value::undefined(name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: undefined_error(obj);
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (key.is_string()) {
        if (obj.is_namespace()) fail("jinja: 'Namespace' object is not subscriptable");
        const Value* v = obj.dict_ref().find(key.str_ref());
        if (v) return *v;
        return get_attr(obj, key.str_ref());
      }
      if (obj.is_dict() && (key.is_number() || key.is_none())) {
        const Value* v = dict_find(obj.dict_ref(), key);
        if (v) return *v;
      }
      return Value::undefined();
    case Value::Kind::kGenerator: fail("jinja: 'generator' object is not subscriptable");
    case Value::Kind::kList:
      if (key.is_int() || key.is_bool()) {
        int64_t n = static_cast<int64_t>(obj.list_ref().size());
        int64_t i = norm_index(key.as_int(), n);
        if (i < 0 || i >= n) return Value::undefined();
        return obj.list_ref()[i];
      }
      if (key.is_string()) return get_attr(obj, key.str_ref());
      return Value::undefined();
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        auto chars = utf8_chars(obj.str_ref());
        int64_t n = static_cast<int64_t>(chars.size());
        int64_t i = norm_index(key.as_int(), n);
        if (i < 0 || i >= n) return Value::undefined();
        return Value(chars[i]);
      }
      if (key.is_string()) return get_attr(obj, key.str_ref());
      return Value::undefined();
    default:
      if (key.is_string()) return get_attr(obj, key.str_ref());
      return Value::undefined();
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList: return v.list_ref();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict_ref().items()) keys.push_back(decode_key(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (auto& c : utf8_chars(v.str_ref())) out.emplace_back(std::move(c));
      return out;
    }
    case Value::Kind::kGenerator: return v.list_ref();
    case Value::Kind::kUndefined: return {};
    default: fail("jinja: '", v.type_name(), "' object is not iterable");
  }
}

Template::Template(const std::string& source, const LexOptions& options)
    : program_(std::make_shared<Program>(parse_template(source, options))) {}

std::string Template::render(const Value& context) const {
  Interpreter in(program_);
  return in.render(context);
}

Interpreter::Interpreter(std::shared_ptr<const Program> program) : program_(std::move(program)) {}

std::string Interpreter::render(const Value& context) {
  auto globals = make_globals();
  auto root = std::make_shared<Frame>();
  root->parent = globals;
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict_ref().items()) root->vars[k] = v;
  } else if (!context.is_undefined() && !context.is_none()) {
    fail("jinja: render context must be a dict, got ", context.type_name());
  }
  std::string out;
  exec(program_->body, root, out);
  return out;
}

Value Interpreter::call(const Value& callee, Args& args, int line) {
  if (callee.is_undefined()) undefined_error(callee);
  if (!callee.is_callable()) fail("jinja: '", callee.type_name(), "' object is not callable");
  (void)line;
  return callee.callable_ref().fn(*this, args);
}

Interpreter::Flow Interpreter::exec(const Body& body, const std::shared_ptr<Frame>& frame, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s, frame, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

void Interpreter::assign(const std::vector<std::string>& names, const Value& v, Frame& frame, int line) {
  if (names.size() == 1) {
    frame.vars[names[0]] = v;
    return;
  }
  std::vector<Value> items;
  if (v.is_list() || v.is_string() || v.is_dict())
    items = iterate(v);
  else
    fail("jinja: cannot unpack non-iterable ", v.type_name(), " object (template line ", line, ")");
  if (items.size() != names.size())
    fail("jinja: cannot unpack ", items.size(), " values into ", names.size(), " names (template line ", line, ")");
  for (size_t i = 0; i < names.size(); ++i) frame.vars[names[i]] = items[i];
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const std::shared_ptr<Frame>& frame, std::string& out) {
  switch (s.kind) {
    case Stmt::Kind::kText: out += s.text; return Flow::kNormal;
    case Stmt::Kind::kOutput: out += eval(*s.expr, frame).to_str(); return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i) {
        if (eval(*s.conds[i], frame).truthy()) return exec(s.bodies[i], frame, out);
      }
      return exec(s.else_body, frame, out);
    case Stmt::Kind::kFor: exec_for(s, frame, out); return Flow::kNormal;
    case Stmt::Kind::kSet: {
      Value v = eval(*s.expr, frame);
      if (!s.attr.empty()) {
        const Value* target = frame->lookup(s.targets[0]);
        if (!target || !target->is_namespace())
          fail("jinja: can only assign attributes of a namespace() object, '", s.targets[0],
               "' is not one (template line ", s.line, ")");
        Value ns = *target;
        ns.dict_mut().set(s.attr, std::move(v));
      } else {
        assign(s.targets, v, *frame, s.line);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock: {
      std::string body;
      exec(s.body, frame, body);
      Value v = eval_filter_chain(s.expr.get(), Value(std::move(body)), frame);
      if (!s.attr.empty()) {
        const Value* target = frame->lookup(s.targets[0]);
        if (!target || !target->is_namespace())
          fail("jinja: can only assign attributes of a namespace() object (template line ", s.line, ")");
        Value ns = *target;
        ns.dict_mut().set(s.attr, std::move(v));
      } else {
        frame->vars[s.targets[0]] = std::move(v);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro: frame->vars[s.name] = make_macro(s, frame); return Flow::kNormal;
    case Stmt::Kind::kCallBlock: {
      const Expr& call = *s.expr;
      Value callee = eval(*call.children[0], frame);
      Args args;
      eval_args(call, frame, args);
      args.keyword.emplace_back("caller", make_macro(s, frame));
      try {
        out += this->call(callee, args, s.line).to_str();
      } catch (const Error& e) {
        std::string m = e.what();
        if (m.find(kLineTag) == std::string::npos) m += str_cat(" ", kLineTag, s.line, ")");
        throw Error(m);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kFilterBlock: {
      std::string body;
      exec(s.body, frame, body);
      out += eval_filter_chain(s.expr.get(), Value(std::move(body)), frame).to_str();
      return Flow::kNormal;
    }
    case Stmt::Kind::kWith: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      for (size_t i = 0; i < s.targets.size(); ++i) inner->vars[s.targets[i]] = eval(*s.defaults[i], frame);
      return exec(s.body, inner, out);
    }
    case Stmt::Kind::kBreak: return Flow::kBreak;
    case Stmt::Kind::kContinue: return Flow::kContinue;
    case Stmt::Kind::kScope: return exec(s.body, frame, out);
  }
  return Flow::kNormal;
}

void Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame, std::string& out) {
  Value iterable = eval(*s.expr, frame);
  std::vector<Value> items;
  try {
    items = iterate(iterable);
  } catch (const Error& e) {
    fail(e.what(), " ", kLineTag, s.line, ")");
  }
  auto loop_frame = std::make_shared<Frame>();
  loop_frame->parent = frame;
  if (s.cond) {
    // `for x in xs if cond`: filtered before the loop, so loop.length/last count kept items.
    std::vector<Value> kept;
    for (auto& item : items) {
      assign(s.targets, item, *loop_frame, s.line);
      if (eval(*s.cond, loop_frame).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    // Each iteration starts from the outer scope: a `set` in the body is not seen by the next
    // iteration (jinja2 resets loop-local assignments), only namespace attributes carry over.
    loop_frame = std::make_shared<Frame>();
    loop_frame->parent = frame;
    assign(s.targets, items[i], *loop_frame, s.line);
    Value loop = Value::dict();
    Dict& d = loop.dict_mut();
    d.set("index", Value(i + 1));
    d.set("index0", Value(i));
    d.set("revindex", Value(n - i));
    d.set("revindex0", Value(n - i - 1));
    d.set("first", Value(i == 0));
    d.set("last", Value(i == n - 1));
    d.set("length", Value(n));
    d.set("depth", Value(int64_t{1}));
    d.set("depth0", Value(int64_t{0}));
    if (i > 0) d.set("previtem", items[i - 1]);
    if (i + 1 < n) d.set("nextitem", items[i + 1]);
    d.set("cycle", Value::callable("loop.cycle", [i](Interpreter&, Args& a) {
            if (a.positional.empty()) fail("jinja: no items for cycling given");
            return a.positional[static_cast<size_t>(i) % a.positional.size()];
          }));
    loop_frame->vars["loop"] = std::move(loop);
    Flow f = exec(s.body, loop_frame, out);
    if (f == Flow::kBreak) break;
  }
  if (n == 0) exec(s.else_body, frame, out);
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Frame>& closure) {
  const Stmt* def = &s;
  // Weak: the defining frame holds the macro, so a strong reference would be a cycle that leaks
  // every render. The frame outlives every place the macro's name is visible.
  std::weak_ptr<Frame> weak_env = closure;
  return Value::callable(s.kind == Stmt::Kind::kMacro ? s.name : "caller", [def, weak_env](Interpreter& in, Args& a) {
    std::shared_ptr<Frame> env = weak_env.lock();
    if (!env) fail("jinja: macro '", def->name, "' called after the scope that defined it ended");
    if (in.call_depth_ >= kMaxCallDepth) fail("jinja: macro calls nested deeper than ", kMaxCallDepth, " (recursion?)");
    struct DepthGuard {
      int& d;
      explicit DepthGuard(int& x) : d(x) { ++d; }
      ~DepthGuard() { --d; }
    } guard(in.call_depth_);
    auto f = std::make_shared<Frame>();
    f->parent = env;
    const auto& params = def->targets;
    if (a.positional.size() > params.size())
      fail("jinja: macro '", def->name, "' takes not more than ", params.size(), " argument(s)");
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < a.positional.size(); ++i) {
      f->vars[params[i]] = a.positional[i];
      bound[i] = true;
    }
    for (auto& [k, v] : a.keyword) {
      size_t j = 0;
      while (j < params.size() && params[j] != k) ++j;
      if (j == params.size()) {
        if (k == "caller") {
          f->vars["caller"] = v;
          continue;
        }
        fail("jinja: macro '", def->name, "' takes no keyword argument '", k, "'");
      }
      f->vars[k] = v;
      bound[j] = true;
    }
    for (size_t j = 0; j < params.size(); ++j) {
      if (bound[j]) continue;
      f->vars[params[j]] = def->defaults[j] ? in.eval(*def->defaults[j], f) : Value::undefined(params[j]);
    }
    std::string out;
    in.exec(def->body, f, out);
    return Value(std::move(out));
  });
}

void Interpreter::eval_args(const Expr& e, const std::shared_ptr<Frame>& frame, Args& args) {
  size_t npos = e.args.size() - e.kwnames.size();
  for (size_t i = 0; i < e.args.size(); ++i) {
    Value v = eval(*e.args[i], frame);
    if (i < npos)
      args.positional.push_back(std::move(v));
    else
      args.keyword.emplace_back(e.kwnames[i - npos], std::move(v));
  }
}

Value Interpreter::eval_filter_chain(const Expr* e, const Value& input, const std::shared_ptr<Frame>& frame) {
  if (!e) return input;
  if (e->kind != Expr::Kind::kFilter) return eval(*e, frame);
  Value v = eval_filter_chain(e->children[0].get(), input, frame);
  Args args;
  eval_args(*e, frame, args);
  try {
    return apply_filter(*this, e->name, v, args);
  } catch (const Error& err) {
    std::string m = err.what();
    if (m.find(kLineTag) == std::string::npos) m += str_cat(" ", kLineTag, e->line, ")");
    throw Error(m);
  }
}

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  try {
    return eval_inner(e, frame);
  } catch (const Error& err) {
    std::string m = err.what();
    if (m.find(kLineTag) != std::string::npos) throw;
    throw Error(str_cat(m, " ", kLineTag, e.line, ")"));
  }
}

Value Interpreter::eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.value;
    case Expr::Kind::kName: {
      const Value* v = frame->lookup(e.name);
      return v ? *v : Value::undefined(e.name);
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const auto& c : e.children) items.push_back(eval(*c, frame));
      return e.kind == Expr::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case Expr::Kind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value k = eval(*e.children[i], frame);
        dict_set(d.dict_mut(), k, eval(*e.children[i + 1], frame));
      }
      return d;
    }
    case Expr::Kind::kGetAttr: return get_attr(eval(*e.children[0], frame), e.name);
    case Expr::Kind::kGetItem: return get_item(eval(*e.children[0], frame), eval(*e.children[1], frame));
    case Expr::Kind::kSlice: {
      Value obj = eval(*e.children[0], frame);
      auto part = [&](size_t i) { return e.children[i] ? eval(*e.children[i], frame) : Value::none(); };
      return slice(obj, part(1), part(2), part(3));
    }
    case Expr::Kind::kCall: {
      Value callee = eval(*e.children[0], frame);
      Args args;
      eval_args(e, frame, args);
      return call(callee, args, e.line);
    }
    case Expr::Kind::kFilter: return eval_filter_chain(&e, Value(), frame);
    case Expr::Kind::kTest: {
      Value v = eval(*e.children[0], frame);
      Args args;
      eval_args(e, frame, args);
      bool r = apply_test(*this, e.name, v, args);
      return Value(e.negated ? !r : r);
    }
    case Expr::Kind::kUnary: {
      Value v = eval(*e.children[0], frame);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) fail("jinja: bad operand type for unary ", e.name, ": '", v.type_name(), "'");
      if (e.name == "-") return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
      return v.is_float() ? v : Value(v.as_int());
    }
    case Expr::Kind::kBinary: {
      if (e.name == "and") {
        Value a = eval(*e.children[0], frame);
        return a.truthy() ? eval(*e.children[1], frame) : a;
      }
      if (e.name == "or") {
        Value a = eval(*e.children[0], frame);
        return a.truthy() ? a : eval(*e.children[1], frame);
      }
      Value a = eval(*e.children[0], frame);
      Value b = eval(*e.children[1], frame);
      if (e.name == "~") return Value(a.to_str() + b.to_str());
      return arith(e.name, a, b);
    }
    case Expr::Kind::kCompare: {
      Value left = eval(*e.children[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.children[i + 1], frame);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") {
          r = values_equal(left, right);
        } else if (op == "!=") {
          r = !values_equal(left, right);
        } else if (op == "in") {
          r = contains(right, left);
        } else if (op == "notin") {
          r = !contains(right, left);
        } else {
          if (left.is_undefined()) undefined_error(left);
          if (right.is_undefined()) undefined_error(right);
          if (op == "<")
            r = values_less(left, right);
          else if (op == ">")
            r = values_less(right, left);
          else if (op == "<=")
            r = !values_less(right, left);
          else
            r = !values_less(left, right);
        }
        if (!r) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::kCondExpr:
      if (eval(*e.children[0], frame).truthy()) return eval(*e.children[1], frame);
      return e.children[2] ? eval(*e.children[2], frame) : Value::undefined();
  }
  fail("jinja: unknown expression node");
}

}  // namespace astrai::tokenizer::jinja
