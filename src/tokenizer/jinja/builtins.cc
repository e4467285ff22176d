#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "base/error.h"
#include "tokenizer/jinja/template.h"

namespace astrai::tokenizer::jinja {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, Args&);
using TestFn = bool (*)(Interpreter&, const Value&, Args&);

// Python's str.isspace() for the characters templates meet (ASCII and common Unicode spaces).
bool is_space_at(const std::string& s, size_t i, size_t* len) {
  unsigned char c = s[i];
  *len = 1;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || (c >= 0x1c && c <= 0x1f))
    return true;
  if (c == 0xc2 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) == 0x85 ||
                                        static_cast<unsigned char>(s[i + 1]) == 0xa0)) {
    *len = 2;
    return true;
  }
  if (c == 0xe2 && i + 2 < s.size()) {
    unsigned char b = s[i + 1], d = s[i + 2];
    if ((b == 0x80 && (d <= 0x8a || d == 0xa8 || d == 0xa9 || d == 0xaf)) || (b == 0x81 && d == 0x9f)) {
      *len = 3;
      return true;
    }
  }
  if (c == 0xe3 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      static_cast<unsigned char>(s[i + 2]) == 0x80) {
    *len = 3;
    return true;
  }
  if (c == 0xe1 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x9a &&
      static_cast<unsigned char>(s[i + 2]) == 0x80) {
    *len = 3;
    return true;
  }
  return false;
}

std::string strip_impl(const std::string& s, const Value& chars, bool left, bool right) {
  if (chars.is_undefined() || chars.is_none()) {
    size_t b = 0, e = s.size(), len;
    if (left)
      while (b < e && is_space_at(s, b, &len)) b += len;
    if (right) {
      while (e > b) {
        // step back one code point
        size_t p = e - 1;
        while (p > b && (static_cast<unsigned char>(s[p]) & 0xc0) == 0x80) --p;
        if (!is_space_at(s, p, &len) || p + len != e) break;
        e = p;
      }
    }
    return s.substr(b, e - b);
  }
  if (!chars.is_string()) fail("jinja: strip arg must be None or str");
  auto set = utf8_chars(chars.str_ref());
  auto cs = utf8_chars(s);
  size_t b = 0, e = cs.size();
  auto in_set = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  if (left)
    while (b < e && in_set(cs[b])) ++b;
  if (right)
    while (e > b && in_set(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::string ascii_upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  std::string out = ascii_lower(s);
  out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string replace_impl(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    auto cs = utf8_chars(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cs.size()) out += cs[i];
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> split_impl(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.is_undefined() || sep.is_none()) {
    size_t i = 0, len;
    const size_t n = s.size();
    while (true) {
      while (i < n && is_space_at(s, i, &len)) i += len;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        // rest, with trailing whitespace stripped as Python does
        out.push_back(strip_impl(s.substr(i), Value(), false, true));
        break;
      }
      size_t j = i;
      while (j < n && !is_space_at(s, j, &len)) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  if (!sep.is_string()) fail("jinja: split separator must be str or None");
  const std::string& d = sep.str_ref();
  if (d.empty()) fail("jinja: empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.push_back(s.substr(pos, f - pos));
    pos = f + d.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::vector<std::string> splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  const size_t n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    size_t brk = 0;
    if (c == '\r') {
      brk = (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
    } else if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
      brk = 1;
    } else if (c == 0xc2 && i + 1 < n && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      brk = 2;
    } else if (c == 0xe2 && i + 2 < n && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xa8 || static_cast<unsigned char>(s[i + 2]) == 0xa9)) {
      brk = 3;
    }
    if (brk) {
      out.push_back(s.substr(start, i - start));
      i += brk;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < n) out.push_back(s.substr(start));
  return out;
}

Value str_list(const std::vector<std::string>& v) {
  std::vector<Value> out;
  for (const auto& s : v) out.emplace_back(s);
  return Value::list(std::move(out));
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) fail("jinja: ", what, " expects a string, got ", v.type_name());
  return v.str_ref();
}

int64_t need_int(const Value& v, const char* what) {
  if (!v.is_int() && !v.is_bool()) fail("jinja: ", what, " expects an integer, got ", v.type_name());
  return v.as_int();
}

// Widths for padding filters, bounded so a template cannot ask for gigabytes.
int64_t need_width(const Value& v, const char* what) {
  int64_t w = need_int(v, what);
  if (w > (int64_t{1} << 24)) fail("jinja: ", what, " ", w, " is too large");
  return w;
}

// Jinja's make_attrgetter: "a.b.0" → nested getitem, integer parts as indices.
Value get_path(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

Value attr_getter(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  return get_path(item, need_str(attribute, "attribute"));
}

// Sort key used by sort/min/max/unique/dictsort: lower-cased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(ascii_lower(v.str_ref()));
  return v;
}

bool to_bool_arg(const Args& a, size_t pos, const char* name, bool dflt) {
  const Value* v = find_arg(a, pos, name);
  return v ? v->truthy() : dflt;
}


// ---------------------------------------------------------------- filters

Value f_tojson(Interpreter&, const Value& v, Args& a) {
  // HF: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
  bool ensure_ascii = to_bool_arg(a, 0, "ensure_ascii", false);
  Value indent_v = arg_or(a, 1, "indent", Value::none());
  Value seps = arg_or(a, 2, "separators", Value::none());
  bool sort_keys = to_bool_arg(a, 3, "sort_keys", false);
  int indent = -1;
  if (indent_v.is_int()) indent = static_cast<int>(std::max<int64_t>(0, indent_v.as_int()));
  else if (!indent_v.is_none()) fail("jinja: tojson indent must be an integer or None");
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.list_ref().size() != 2) fail("jinja: tojson separators must be a pair");
    item_sep = need_str(seps.list_ref()[0], "tojson separators");
    key_sep = need_str(seps.list_ref()[1], "tojson separators");
  }
  if (v.is_undefined()) fail("jinja: Object of type Undefined is not JSON serializable");
  return Value(v.to_json(indent, item_sep, key_sep, sort_keys, ensure_ascii));
}

Value f_trim(Interpreter&, const Value& v, Args& a) {
  return Value(strip_impl(v.to_str(), arg_or(a, 0, "chars", Value::none()), true, true));
}
Value f_upper(Interpreter&, const Value& v, Args&) { return Value(ascii_upper(v.to_str())); }
Value f_lower(Interpreter&, const Value& v, Args&) { return Value(ascii_lower(v.to_str())); }
Value f_capitalize(Interpreter&, const Value& v, Args&) { return Value(capitalize(v.to_str())); }
Value f_title(Interpreter&, const Value& v, Args&) {
  // jinja: split on runs of [-\s({[<], capitalize each piece.
  std::string s = v.to_str(), out, word;
  auto is_sep = [](char c) {
    return c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '(' ||
           c == '{' || c == '[' || c == '<';
  };
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    bool sep = is_sep(s[i]);
    while (j < s.size() && is_sep(s[j]) == sep) ++j;
    std::string piece = s.substr(i, j - i);
    if (sep) {
      out += piece;
    } else {
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(piece[0])));
      out += ascii_lower(piece.substr(1));
    }
    i = j;
  }
  return Value(out);
}

Value f_length(Interpreter&, const Value& v, Args&) {
  switch (v.kind()) {
    case Value::Kind::kString: return Value(static_cast<int64_t>(utf8_length(v.str_ref())));
    case Value::Kind::kList: return Value(static_cast<int64_t>(v.list_ref().size()));
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: return Value(static_cast<int64_t>(v.dict_ref().size()));
    case Value::Kind::kUndefined: return Value(int64_t{0});
    default: fail("jinja: object of type '", v.type_name(), "' has no len()");
  }
}

Value f_first(Interpreter&, const Value& v, Args&) {
  auto items = iterate(v);
  return items.empty() ? Value::undefined() : items.front();
}
Value f_last(Interpreter&, const Value& v, Args&) {
  if (v.is_undefined() || v.is_generator()) fail("jinja: '", v.type_name(), "' object is not reversible");
  auto items = iterate(v);
  return items.empty() ? Value::undefined() : items.back();
}

Value f_join(Interpreter&, const Value& v, Args& a) {
  std::string sep = arg_or(a, 0, "d", Value("")).to_str();
  Value attribute = arg_or(a, 1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += (attribute.is_none() ? item : attr_getter(item, attribute)).to_str();
  }
  return Value(out);
}

Value f_default(Interpreter&, const Value& v, Args& a) {
  Value dflt = arg_or(a, 0, "default_value", Value(""));
  bool boolean = to_bool_arg(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
  return v;
}

Value f_replace(Interpreter&, const Value& v, Args& a) {
  const Value* from = find_arg(a, 0, "old");
  const Value* to = find_arg(a, 1, "new");
  if (!from || !to) fail("jinja: replace() needs old and new");
  Value count = arg_or(a, 2, "count", Value::none());
  return Value(replace_impl(v.to_str(), from->to_str(), to->to_str(), count.is_none() ? -1 : need_int(count, "replace count")));
}

Value f_string(Interpreter&, const Value& v, Args&) { return v.is_string() ? v : Value(v.to_str()); }
Value f_safe(Interpreter&, const Value& v, Args&) { return v.is_markup() ? v : Value::markup(v.to_str()); }
Value f_escape(Interpreter&, const Value& v, Args&) {
  return v.is_markup() ? v : Value::markup(html_escape(v.to_str()));
}
Value f_forceescape(Interpreter&, const Value& v, Args&) { return Value::markup(html_escape(v.to_str())); }

Value f_int(Interpreter&, const Value& v, Args& a) {
  Value dflt = arg_or(a, 0, "default", Value(int64_t{0}));
  int64_t base = need_int(arg_or(a, 1, "base", Value(int64_t{10})), "int base");
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return Value(static_cast<int64_t>(v.as_float()));
  if (v.is_string()) {
    std::string s = strip_impl(v.str_ref(), Value(), true, true);
    try {
      size_t used = 0;
      int64_t r = std::stoll(s, &used, static_cast<int>(base));
      if (used == s.size()) return Value(r);
    } catch (...) {
    }
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size() && std::isfinite(d)) return Value(static_cast<int64_t>(d));
    } catch (...) {
    }
  }
  return dflt;
}

Value f_float(Interpreter&, const Value& v, Args& a) {
  Value dflt = arg_or(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    std::string s = strip_impl(v.str_ref(), Value(), true, true);
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (...) {
    }
  }
  return dflt;
}

Value f_list(Interpreter&, const Value& v, Args&) { return Value::list(iterate(v)); }

Value f_items(Interpreter&, const Value& v, Args&) {
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) fail("jinja: Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict_ref().items()) out.push_back(Value::tuple({decode_key(k), x}));
  return Value::generator(std::move(out));
}

bool run_test(Interpreter& in, const Value& item, const std::string& test, const std::vector<Value>& extra) {
  Args ta;
  ta.positional = extra;
  return apply_test(in, test, item, ta);
}

// select/reject/selectattr/rejectattr share this.
Value select_impl(Interpreter& in, const Value& v, Args& a, bool by_attr, bool keep) {
  if (!v.truthy()) return Value::generator({});  // jinja: `if value:` before touching the args
  size_t first_extra = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) fail("jinja: selectattr/rejectattr need an attribute");
    attribute = a.positional[0];
    first_extra = 1;
  }
  std::string test;
  std::vector<Value> extra;
  if (a.positional.size() > first_extra) {
    test = need_str(a.positional[first_extra], "select test name");
    if (!has_test(test)) fail("jinja: no test named '", test, "'");
    extra.assign(a.positional.begin() + first_extra + 1, a.positional.end());
  }
  std::vector<Value> out;
  for (const auto& item : iterate(v)) {
    Value probe = by_attr ? attr_getter(item, attribute) : item;
    bool r = test.empty() ? probe.truthy() : run_test(in, probe, test, extra);
    if (r == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, true, false); }

Value f_map(Interpreter& in, const Value& v, Args& a) {
  if (!v.truthy()) return Value::generator({});
  std::vector<Value> out;
  const Value* attribute = find_arg(a, 99, "attribute");
  if (attribute) {
    Value dflt = arg_or(a, 99, "default", Value());
    for (const auto& item : iterate(v)) {
      Value r = attr_getter(item, *attribute);
      out.push_back(r.is_undefined() && find_arg(a, 99, "default") ? dflt : r);
    }
    return Value::generator(std::move(out));
  }
  if (a.positional.empty()) fail("jinja: map() needs a filter name or attribute=");
  std::string name = need_str(a.positional[0], "map filter name");
  if (!has_filter(name)) fail("jinja: no filter named '", name, "'");
  for (const auto& item : iterate(v)) {
    Args fa;
    fa.positional.assign(a.positional.begin() + 1, a.positional.end());
    fa.keyword = a.keyword;
    out.push_back(apply_filter(in, name, item, fa));
  }
  return Value::generator(std::move(out));
}

// |attr is getattr() only: a dict's keys are not its attributes (its methods are).
Value f_attr(Interpreter&, const Value& v, Args& a) {
  std::string name = need_str(arg_or(a, 0, "name", Value()), "attr");
  if (v.is_undefined() || v.is_namespace()) return get_attr(v, name);
  return get_method(v, name);
}

Value f_unique(Interpreter&, const Value& v, Args& a) {
  bool cs = to_bool_arg(a, 0, "case_sensitive", false);
  Value attribute = arg_or(a, 1, "attribute", Value::none());
  std::vector<Value> out, seen;
  for (const auto& item : iterate(v)) {
    Value key = sort_key(attribute.is_none() ? item : attr_getter(item, attribute), cs);
    bool dup = false;
    for (const auto& s : seen)
      if (values_equal(s, key)) dup = true;
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::generator(std::move(out));
}

Value f_sort(Interpreter&, const Value& v, Args& a) {
  bool reverse = to_bool_arg(a, 0, "reverse", false);
  bool cs = to_bool_arg(a, 1, "case_sensitive", false);
  Value attribute = arg_or(a, 2, "attribute", Value::none());
  std::vector<Value> items = iterate(v);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i)
    keyed.emplace_back(sort_key(attribute.is_none() ? items[i] : attr_getter(items[i], attribute), cs), i);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? values_less(y.first, x.first) : values_less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, i] : keyed) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_dictsort(Interpreter&, const Value& v, Args& a) {
  bool cs = to_bool_arg(a, 0, "case_sensitive", false);
  std::string by = arg_or(a, 1, "by", Value("key")).to_str();
  bool reverse = to_bool_arg(a, 2, "reverse", false);
  if (!v.is_dict()) fail("jinja: dictsort expects a mapping");
  std::vector<Value> items;
  for (const auto& [k, x] : v.dict_ref().items()) items.push_back(Value::tuple({decode_key(k), x}));
  size_t idx = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (idx == 2) fail("jinja: You can only sort by either \"key\" or \"value\"");
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.list_ref()[idx], cs), ky = sort_key(y.list_ref()[idx], cs);
    return reverse ? values_less(ky, kx) : values_less(kx, ky);
  });
  return Value::list(std::move(items));
}

Value minmax(const Value& v, Args& a, bool want_max) {
  bool cs = to_bool_arg(a, 0, "case_sensitive", false);
  Value attribute = arg_or(a, 1, "attribute", Value::none());
  auto items = iterate(v);
  if (items.empty()) return Value::undefined();
  size_t best = 0;
  auto key = [&](size_t i) { return sort_key(attribute.is_none() ? items[i] : attr_getter(items[i], attribute), cs); };
  for (size_t i = 1; i < items.size(); ++i) {
    if (want_max ? values_less(key(best), key(i)) : values_less(key(i), key(best))) best = i;
  }
  return items[best];
}
Value f_min(Interpreter&, const Value& v, Args& a) { return minmax(v, a, false); }
Value f_max(Interpreter&, const Value& v, Args& a) { return minmax(v, a, true); }

Value f_sum(Interpreter&, const Value& v, Args& a) {
  Value attribute = arg_or(a, 0, "attribute", Value::none());
  Value total = arg_or(a, 1, "start", Value(int64_t{0}));
  for (const auto& item : iterate(v)) {
    Value x = attribute.is_none() ? item : attr_getter(item, attribute);
    if (!x.is_number() || !total.is_number()) fail("jinja: sum() of non-numbers (", x.type_name(), ")");
    total = (x.is_float() || total.is_float()) ? Value(total.as_float() + x.as_float()) : Value(total.as_int() + x.as_int());
  }
  return total;
}

Value f_abs(Interpreter&, const Value& v, Args&) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_number()) return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  fail("jinja: bad operand type for abs(): '", v.type_name(), "'");
}

Value f_round(Interpreter&, const Value& v, Args& a) {
  int64_t precision = need_int(arg_or(a, 0, "precision", Value(int64_t{0})), "round precision");
  std::string method = arg_or(a, 1, "method", Value("common")).to_str();
  if (!v.is_number()) fail("jinja: round() expects a number");
  double x = v.as_float();
  double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "common") {
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    // Python's round(): half to even.
    double r = std::nearbyint(x * scale) / scale;
    return Value(r);
  }
  if (method == "ceil") return Value(std::ceil(x * scale) / scale);
  if (method == "floor") return Value(std::floor(x * scale) / scale);
  fail("jinja: method must be common, ceil or floor");
}

Value f_reverse(Interpreter&, const Value& v, Args&) {
  if (v.is_string()) {
    auto cs = utf8_chars(v.str_ref());
    std::string out;
    for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
    return Value(out);
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  // reversed(list) is an iterator in Python; a generator input is listed first.
  return v.is_generator() ? Value::list(std::move(items)) : Value::generator(std::move(items));
}

Value f_batch(Interpreter&, const Value& v, Args& a) {
  int64_t n = need_int(arg_or(a, 0, "linecount", Value()), "batch linecount");
  if (n <= 0) fail("jinja: batch size must be positive");
  const Value* fill = find_arg(a, 1, "fill_with");
  std::vector<Value> out, cur;
  for (const auto& item : iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::generator(std::move(out));
}

Value f_indent(Interpreter&, const Value& v, Args& a) {
  Value width = arg_or(a, 0, "width", Value(int64_t{4}));
  bool first = to_bool_arg(a, 1, "first", false);
  bool blank = to_bool_arg(a, 2, "blank", false);
  std::string ind = width.is_string() ? width.str_ref() : std::string(static_cast<size_t>(std::max<int64_t>(0, need_width(width, "indent width"))), ' ');
  std::string s = v.to_str() + "\n";
  auto lines = splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  return Value(rv);
}

std::string center_impl(const std::string& s, int64_t width) {
  int64_t n = static_cast<int64_t>(utf8_length(s));
  if (width <= n) return s;
  int64_t marg = width - n;
  int64_t left = marg / 2 + (marg & width & 1);  // CPython's pad() rounding
  return std::string(left, ' ') + s + std::string(marg - left, ' ');
}

Value f_center(Interpreter&, const Value& v, Args& a) {
  return Value(center_impl(v.to_str(), need_width(arg_or(a, 0, "width", Value(int64_t{80})), "center width")));
}

Value f_wordcount(Interpreter&, const Value& v, Args&) {
  std::string s = v.to_str();
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : s) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_striptags(Interpreter&, const Value& v, Args&) {
  std::string s = v.to_str(), out;
  bool in_tag = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i);
      if (e != std::string::npos) {
        i = e + 2;
        continue;
      }
    }
    if (s[i] == '<' && s.find('>', i) != std::string::npos) in_tag = true;
    if (!in_tag) out += s[i];
    if (s[i] == '>') in_tag = false;
  }
  // collapse whitespace
  auto words = split_impl(out, Value(), -1);
  std::string joined;
  for (size_t i = 0; i < words.size(); ++i) joined += (i ? " " : "") + words[i];
  return Value(joined);
}

Value f_format(Interpreter&, const Value& v, Args& a) {
  if (!a.keyword.empty()) fail("jinja: format filter with keyword arguments is not supported");
  return Value(python_percent_format(v.to_str(), a.positional));
}

Value f_count(Interpreter& in, const Value& v, Args& a) { return f_length(in, v, a); }

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> m = {
      {"tojson", f_tojson}, {"trim", f_trim}, {"upper", f_upper}, {"lower", f_lower},
      {"capitalize", f_capitalize}, {"title", f_title}, {"length", f_length}, {"count", f_count},
      {"first", f_first}, {"last", f_last}, {"join", f_join}, {"default", f_default}, {"d", f_default},
      {"replace", f_replace}, {"string", f_string}, {"safe", f_safe}, {"e", f_escape}, {"escape", f_escape},
      {"forceescape", f_forceescape}, {"int", f_int}, {"float", f_float}, {"list", f_list}, {"items", f_items},
      {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"map", f_map}, {"attr", f_attr}, {"unique", f_unique}, {"sort", f_sort}, {"dictsort", f_dictsort},
      {"min", f_min}, {"max", f_max}, {"sum", f_sum}, {"abs", f_abs}, {"round", f_round},
      {"reverse", f_reverse}, {"batch", f_batch}, {"indent", f_indent}, {"center", f_center},
      {"wordcount", f_wordcount}, {"striptags", f_striptags}, {"format", f_format},
  };
  return m;
}

// ---------------------------------------------------------------- tests

bool t_defined(Interpreter&, const Value& v, Args&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, Args&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, Args&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, Args&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, Args&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, Args&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, Args&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, Args&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, Args&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, Args&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, Args&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, Args&) {
  return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined() || v.is_generator();
}
bool t_sequence(Interpreter&, const Value& v, Args&) {
  return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
}
bool t_callable(Interpreter&, const Value& v, Args&) { return v.is_callable(); }
bool t_odd(Interpreter&, const Value& v, Args&) { return need_int(v, "odd test") % 2 != 0; }
bool t_even(Interpreter&, const Value& v, Args&) { return need_int(v, "even test") % 2 == 0; }
bool t_divisibleby(Interpreter&, const Value& v, Args& a) {
  int64_t n = need_int(arg_or(a, 0, "num", Value()), "divisibleby");
  if (n == 0) fail("jinja: integer division or modulo by zero");
  return need_int(v, "divisibleby") % n == 0;
}
const Value& other_arg(Args& a) {
  if (a.positional.empty()) fail("jinja: test needs an argument");
  return a.positional[0];
}
bool t_eq(Interpreter&, const Value& v, Args& a) { return values_equal(v, other_arg(a)); }
bool t_ne(Interpreter&, const Value& v, Args& a) { return !values_equal(v, other_arg(a)); }
bool t_lt(Interpreter&, const Value& v, Args& a) { return values_less(v, other_arg(a)); }
bool t_gt(Interpreter&, const Value& v, Args& a) { return values_less(other_arg(a), v); }
bool t_le(Interpreter&, const Value& v, Args& a) { return !values_less(other_arg(a), v); }
bool t_ge(Interpreter&, const Value& v, Args& a) { return !values_less(v, other_arg(a)); }
bool t_in(Interpreter&, const Value& v, Args& a) {
  const Value& c = other_arg(a);
  if (c.is_string()) return v.is_string() && c.str_ref().find(v.str_ref()) != std::string::npos;
  if (c.is_dict()) return encode_key(v), dict_find(c.dict_ref(), v) != nullptr;
  for (const auto& x : iterate(c))
    if (values_equal(x, v)) return true;
  return false;
}
bool t_sameas(Interpreter&, const Value& v, Args& a) {
  const Value& o = other_arg(a);
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.is_bool()) return v.as_bool() == o.as_bool();
  if (v.is_list()) return &v.list_ref() == &o.list_ref();
  if (v.is_dict() || v.is_namespace()) return v.dict_ptr() == o.dict_ptr();
  return values_equal(v, o);
}
bool str_is_lower(const std::string& s) {
  bool cased = false;
  for (unsigned char c : s) {
    if (std::isupper(c)) return false;
    if (std::islower(c)) cased = true;
  }
  return cased;
}
bool str_is_upper(const std::string& s) {
  bool cased = false;
  for (unsigned char c : s) {
    if (std::islower(c)) return false;
    if (std::isupper(c)) cased = true;
  }
  return cased;
}
bool t_lower(Interpreter&, const Value& v, Args&) { return v.is_string() && str_is_lower(v.str_ref()); }
bool t_upper(Interpreter&, const Value& v, Args&) { return v.is_string() && str_is_upper(v.str_ref()); }
bool t_filter(Interpreter&, const Value& v, Args&) { return v.is_string() && has_filter(v.str_ref()); }
bool t_test(Interpreter&, const Value& v, Args&) { return v.is_string() && has_test(v.str_ref()); }
bool t_escaped(Interpreter&, const Value& v, Args&) { return v.is_markup(); }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
      {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
      {"callable", t_callable}, {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby},
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt},
      {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt},
      {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas}, {"lower", t_lower},
      {"upper", t_upper}, {"filter", t_filter}, {"test", t_test}, {"escaped", t_escaped},
  };
  return m;
}

// ---------------------------------------------------------------- methods

Value str_format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      size_t e = fmt.find('}', i);
      if (e == std::string::npos) fail("jinja: str.format: single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        fail("jinja: str.format format specs and conversions are not supported");
      Value v;
      if (field.empty()) {
        if (auto_idx >= a.positional.size()) fail("jinja: str.format: index out of range");
        v = a.positional[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), [](char x) { return std::isdigit(static_cast<unsigned char>(x)); })) {
        size_t k = std::stoul(field);
        if (k >= a.positional.size()) fail("jinja: str.format: index out of range");
        v = a.positional[k];
      } else {
        const Value* kv = find_arg(a, static_cast<size_t>(-1), field.c_str());
        if (!kv) fail("jinja: str.format: missing key '", field, "'");
        v = *kv;
      }
      out += v.to_str();
      i = e;
    } else if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else fail("jinja: str.format: single '}' encountered in format string");
      out += '}';
    } else {
      out += c;
    }
  }
  return Value(out);
}

bool prefix_match(const std::string& s, const Value& arg, bool suffix) {
  auto one = [&](const Value& p) {
    const std::string& x = need_str(p, suffix ? "endswith" : "startswith");
    if (x.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (arg.is_list()) {
    for (const auto& p : arg.list_ref())
      if (one(p)) return true;
    return false;
  }
  return one(arg);
}

int64_t char_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8_length(s.substr(0, byte_pos)));
}

Value string_method(const std::string& s, const std::string& name, Args& a) {
  if (name == "strip") return Value(strip_impl(s, arg_or(a, 0, "chars", Value::none()), true, true));
  if (name == "lstrip") return Value(strip_impl(s, arg_or(a, 0, "chars", Value::none()), true, false));
  if (name == "rstrip") return Value(strip_impl(s, arg_or(a, 0, "chars", Value::none()), false, true));
  if (name == "split") {
    Value ms = arg_or(a, 1, "maxsplit", Value(int64_t{-1}));
    return str_list(split_impl(s, arg_or(a, 0, "sep", Value::none()), need_int(ms, "split maxsplit")));
  }
  if (name == "rsplit") {
    Value ms = arg_or(a, 1, "maxsplit", Value(int64_t{-1}));
    if (need_int(ms, "rsplit maxsplit") >= 0) fail("jinja: str.rsplit with maxsplit is not supported");
    return str_list(split_impl(s, arg_or(a, 0, "sep", Value::none()), -1));
  }
  if (name == "splitlines") return str_list(splitlines(s));
  if (name == "startswith") return Value(prefix_match(s, arg_or(a, 0, "prefix", Value()), false));
  if (name == "endswith") return Value(prefix_match(s, arg_or(a, 0, "suffix", Value()), true));
  if (name == "upper") return Value(ascii_upper(s));
  if (name == "lower") return Value(ascii_lower(s));
  if (name == "capitalize") return Value(capitalize(s));
  if (name == "title") {
    std::string out = s;
    bool prev_cased = false;
    for (auto& c : out) {
      unsigned char u = c;
      if (std::isalpha(u)) {
        c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
        prev_cased = true;
      } else {
        prev_cased = false;
      }
    }
    return Value(out);
  }
  if (name == "replace") {
    Value count = arg_or(a, 2, "count", Value(int64_t{-1}));
    return Value(replace_impl(s, need_str(arg_or(a, 0, "old", Value()), "replace"),
                              need_str(arg_or(a, 1, "new", Value()), "replace"), need_int(count, "replace count")));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    if (a.positional.size() > 1) fail("jinja: str.", name, " with start/end is not supported");
    std::string sub = need_str(arg_or(a, 0, "sub", Value()), name.c_str());
    size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name.find("index") != std::string::npos) fail("jinja: substring not found");
      return Value(int64_t{-1});
    }
    return Value(char_index(s, p));
  }
  if (name == "count") {
    std::string sub = need_str(arg_or(a, 0, "sub", Value()), "count");
    if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (name == "format") return str_format(s, a);
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const auto& item : iterate(arg_or(a, 0, "iterable", Value()))) {
      if (!first) out += s;
      first = false;
      out += need_str(item, "str.join");
    }
    return Value(out);
  }
  auto all_chars = [&](auto pred) {
    if (s.empty()) return Value(false);
    for (unsigned char c : s)
      if (!pred(c)) return Value(false);
    return Value(true);
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return all_chars([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all_chars([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all_chars([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return all_chars([](unsigned char c) { return std::isspace(c) != 0; });
  if (name == "isupper") return Value(str_is_upper(s));
  if (name == "islower") return Value(str_is_lower(s));
  if (name == "removeprefix" || name == "removesuffix") {
    std::string x = need_str(arg_or(a, 0, "prefix", Value()), name.c_str());
    bool suffix = name == "removesuffix";
    if (x.size() <= s.size() &&
        (suffix ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0))
      return Value(suffix ? s.substr(0, s.size() - x.size()) : s.substr(x.size()));
    return Value(s);
  }
  if (name == "center") return Value(center_impl(s, need_width(arg_or(a, 0, "width", Value()), "center width")));
  if (name == "ljust" || name == "rjust" || name == "zfill") {
    int64_t width = need_width(arg_or(a, 0, "width", Value()), name.c_str());
    int64_t n = static_cast<int64_t>(utf8_length(s));
    if (width <= n) return Value(s);
    std::string pad(width - n, name == "zfill" ? '0' : ' ');
    return Value(name == "ljust" ? s + pad : pad + s);
  }
  fail("jinja: str method '", name, "' is not supported");
}

bool is_str_method(const std::string& n) {
  static const char* kNames[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith",
                                 "endswith", "upper", "lower", "capitalize", "title", "replace", "find", "rfind",
                                 "index", "rindex", "count", "format", "join", "isdigit", "isnumeric",
                                 "isdecimal", "isalpha", "isalnum", "isspace", "isupper", "islower",
                                 "removeprefix", "removesuffix", "center", "ljust", "rjust", "zfill",
                                 "casefold", "swapcase", "partition", "rpartition", "expandtabs", "encode",
                                 "istitle", "isidentifier", "isprintable", "isascii", "translate",
                                 "maketrans", "format_map"};
  return std::find_if(std::begin(kNames), std::end(kNames), [&](const char* x) { return n == x; }) != std::end(kNames);
}

}  // namespace

const Value* find_arg(const Args& args, size_t pos, const char* name) {
  if (pos < args.positional.size()) return &args.positional[pos];
  for (const auto& [k, v] : args.keyword)
    if (k == name) return &v;
  return nullptr;
}

Value arg_or(const Args& args, size_t pos, const char* name, Value fallback) {
  const Value* v = find_arg(args, pos, name);
  return v ? *v : fallback;
}

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

Value apply_filter(Interpreter& in, const std::string& name, const Value& value, Args& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("jinja: unsupported or unknown filter '", name, "'");
  return it->second(in, value, args);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& value, Args& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("jinja: unsupported or unknown test '", name, "'");
  return it->second(in, value, args);
}

Value get_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    if (!is_str_method(name)) return Value::undefined(name);
    std::string s = obj.str_ref();
    return Value::callable("str." + name, [s, name](Interpreter&, Args& a) { return string_method(s, name, a); });
  }
  if (obj.is_dict()) {
    static const char* kUnsafe[] = {"pop", "popitem", "update", "setdefault", "clear"};
    for (const char* u : kUnsafe)
      if (name == u)
        return Value::callable("dict." + name, [name](Interpreter&, Args&) -> Value {
          fail("jinja: access to attribute '", name, "' of 'dict' object is unsafe (immutable sandbox)");
        });
    if (name != "items" && name != "keys" && name != "values" && name != "get" && name != "copy")
      return Value::undefined(name);
    Value d = obj;
    return Value::callable("dict." + name, [d, name](Interpreter&, Args& a) -> Value {
      if (name == "items") {
        std::vector<Value> out;
        for (const auto& [k, v] : d.dict_ref().items()) out.push_back(Value::tuple({decode_key(k), v}));
        return Value::list(std::move(out));
      }
      if (name == "keys") return Value::list(iterate(d));
      if (name == "values") {
        std::vector<Value> out;
        for (const auto& kv : d.dict_ref().items()) out.push_back(kv.second);
        return Value::list(std::move(out));
      }
      if (name == "copy") return Value::dict(std::make_shared<Dict>(d.dict_ref()));
      // get
      Value key = arg_or(a, 0, "key", Value());
      Value dflt = arg_or(a, 1, "default", Value::none());
      encode_key(key);  // unhashable → error, as in Python
      const Value* v = dict_find(d.dict_ref(), key);
      return v ? *v : dflt;
    });
  }
  if (obj.is_list()) {
    static const char* kUnsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
    for (const char* u : kUnsafe)
      if (name == u)
        return Value::callable("list." + name, [name](Interpreter&, Args&) -> Value {
          fail("jinja: access to attribute '", name, "' of 'list' object is unsafe (immutable sandbox)");
        });
    if (name != "index" && name != "count" && name != "copy") return Value::undefined(name);
    Value l = obj;
    return Value::callable("list." + name, [l, name](Interpreter&, Args& a) -> Value {
      if (name == "copy") return Value::list(l.list_ref());
      Value x = arg_or(a, 0, "value", Value());
      int64_t n = 0;
      for (size_t i = 0; i < l.list_ref().size(); ++i) {
        if (values_equal(l.list_ref()[i], x)) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") fail("jinja: ", x.repr(), " is not in list");
      return Value(n);
    });
  }
  return Value::undefined(name);
}

std::string python_percent_format(const std::string& fmt, const std::vector<Value>& args) {
  std::string out;
  size_t ai = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("jinja: incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i])) spec += fmt[i++];
    while (i < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[i])) || fmt[i] == '.')) spec += fmt[i++];
    if (i >= fmt.size()) fail("jinja: incomplete format");
    char conv = fmt[i];
    if (ai >= args.size()) fail("jinja: not enough arguments for format string");
    const Value& v = args[ai++];
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        std::string s = conv == 's' ? v.to_str() : v.repr();
        std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), s.c_str());
        out += (spec == "%") ? s : std::string(buf);
        break;
      }
      case 'd':
      case 'i':
        if (!v.is_number()) fail("jinja: %d format: a number is required, not ", v.type_name());
        std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), static_cast<long long>(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.as_int()));
        out += buf;
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'g':
        if (!v.is_number()) fail("jinja: %", conv, " format: a number is required, not ", v.type_name());
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v.as_float());
        out += buf;
        break;
      case 'x':
      case 'X':
        std::snprintf(buf, sizeof(buf), (spec + "ll" + conv).c_str(), static_cast<long long>(v.as_int()));
        out += buf;
        break;
      default: fail("jinja: unsupported format character '", conv, "'");
    }
  }
  if (ai < args.size()) fail("jinja: not all arguments converted during string formatting");
  return out;
}

}  // namespace astrai::tokenizer::jinja
