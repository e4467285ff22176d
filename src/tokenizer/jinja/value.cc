#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/error.h"

namespace astrai::tokenizer::jinja {

const Value* Dict::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value* Dict::find(const std::string& key) {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const std::string& key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string name) {
  Value v;
  v.s_ = std::move(name);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<std::vector<Value>>(std::move(items));
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::kGenerator;
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string encode_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString: return k.str_ref();
    case Value::Kind::kNone: return std::string("\0n", 2);
    case Value::Kind::kBool: return std::string("\0b", 2) + (k.as_bool() ? "1" : "0");
    case Value::Kind::kInt: return std::string("\0i", 2) + std::to_string(k.as_int());
    case Value::Kind::kFloat: return std::string("\0f", 2) + python_float_repr(k.as_float());
    default: fail("jinja: unhashable type: '", k.type_name(), "'");
  }
}

Value decode_key(const std::string& k) {
  if (k.empty() || k[0] != '\0') return Value(k);
  if (k[1] == 'n') return Value::none();
  if (k[1] == 'b') return Value(k[2] == '1');
  if (k[1] == 'i') return Value(static_cast<int64_t>(std::stoll(k.substr(2))));
  return Value(std::stod(k.substr(2)));
}

const Value* dict_find(const Dict& d, const Value& key) {
  if (key.is_string()) return d.find(key.str_ref());
  const Value* v = d.find(encode_key(key));
  if (v || !key.is_number()) return v;
  // Equal numbers of other types: 1 == 1.0 == True.
  double f = key.as_float();
  if (!key.is_float() && (v = d.find(encode_key(Value(f))))) return v;
  if (std::floor(f) == f && std::fabs(f) < 9e18) {
    int64_t i = static_cast<int64_t>(f);
    if (!key.is_int() && (v = d.find(encode_key(Value(i))))) return v;
    if (!key.is_bool() && (i == 0 || i == 1) && (v = d.find(encode_key(Value(i == 1))))) return v;
  }
  return nullptr;
}

void dict_set(Dict& d, const Value& key, Value value) {
  if (Value* existing = const_cast<Value*>(dict_find(d, key))) {
    *existing = std::move(value);
    return;
  }
  d.set(encode_key(key), std::move(value));
}

Value Value::dict() { return dict(std::make_shared<Dict>()); }

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::move(d);
  return v;
}

Value Value::ns() {
  Value v = dict();
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

namespace {
template <typename J>
Value from_json_impl(const J& j, int depth = 0) {
  if (depth > 512) fail("jinja: JSON input nested deeper than 512 levels");
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer: return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) fail("jinja: integer ", u, " is too large");
      return Value(static_cast<int64_t>(u));
    }
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e, depth + 1));
      return Value::list(std::move(items));
    }
    case J::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict_mut().set(it.key(), from_json_impl(it.value(), depth + 1));
      return d;
    }
    default: fail("jinja: unsupported JSON value (", j.type_name(), ")");
  }
}
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }
Value Value::from_json(const nlohmann::json& j) { return from_json_impl(j); }

double Value::as_float() const {
  switch (kind_) {
    case Kind::kFloat: return f_;
    case Kind::kInt: return static_cast<double>(i_);
    case Kind::kBool: return b_ ? 1.0 : 0.0;
    default: fail("jinja: expected a number, got ", type_name());
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !s_.empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return dict_->size() != 0;
    case Kind::kNamespace:
    case Kind::kCallable:
    case Kind::kGenerator: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
    case Kind::kGenerator: return "generator";
  }
  return "?";
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |v| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    int x = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {
// Decodes one UTF-8 code point at s[i]; returns its length (1 for an invalid byte).
size_t utf8_len_at(const std::string& s, size_t i, uint32_t* cp) {
  unsigned char c = s[i];
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  if (cp) {
    if (n == 1) {
      *cp = c;
    } else {
      uint32_t v = c & (0x7f >> n);
      for (size_t k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      *cp = v;
    }
  }
  return n;
}

bool is_printable(uint32_t cp) {
  // Python's str.isprintable() for repr: control chars and a few separators are escaped.
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp >= 0x80 && cp < 0xa0) return false;
  if (cp == 0xad) return false;
  if (cp == 0x2028 || cp == 0x2029) return false;
  if (cp >= 0x200b && cp <= 0x200f) return false;
  if (cp >= 0x202a && cp <= 0x202e) return false;
  if (cp >= 0x2060 && cp <= 0x2064) return false;
  if (cp == 0xfeff) return false;
  if (cp >= 0xd800 && cp <= 0xdfff) return false;
  if (cp >= 0xe000 && cp <= 0xf8ff) return false;  // private use
  if (cp == 0x3000 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x202f ||
      cp == 0x205f)
    return false;  // Zs other than ASCII space are not printable in Python
  return true;
}
}  // namespace

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_len_at(s, i, nullptr);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xc0) != 0x80) ++n;
  return n;
}

std::string python_str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = utf8_len_at(s, i, &cp);
    char buf[16];
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!is_printable(cp)) {
      if (cp < 0x100)
        std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      out += buf;
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  out += quote;
  return out;
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return s_;
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return python_float_repr(f_);
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kString: return python_str_repr(s_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items()) {
        if (!first) out += ", ";
        first = false;
        out += decode_key(k).repr() + ": " + v.repr();
      }
      return out + "}";
    }
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : dict_->items()) {
        if (!first) out += ", ";
        first = false;
        out += decode_key(k).repr() + ": " + v.repr();
      }
      return out + "}>";
    }
    case Kind::kCallable:
      // Python prints "<built-in method ... at 0x...>": an address we cannot reproduce.
      fail("jinja: printing a function object ('", callable_->name, "') is not supported");
    case Kind::kGenerator:
      // Python prints "<generator object ... at 0x...>": an address we cannot reproduce.
      fail("jinja: printing a generator object (the result of map/select/reject/... without |list) is not supported");
    default: return to_str();
  }
}

namespace {
void json_string(const std::string& s, std::string& out, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = s[i];
    if (ensure_ascii && c >= 0x80) {
      uint32_t cp;
      size_t n = utf8_len_at(s, i, &cp);
      i += n - 1;
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, int level, const std::string& item_sep, const std::string& key_sep,
               bool sort_keys, bool ensure_ascii, std::string& out) {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      double f = v.as_float();
      if (std::isnan(f))
        out += "NaN";
      else if (std::isinf(f))
        out += f > 0 ? "Infinity" : "-Infinity";
      else
        out += python_float_repr(f);
      return;
    }
    case Value::Kind::kString: json_string(v.str_ref(), out, ensure_ascii); return;
    case Value::Kind::kList: {
      const auto& items = v.list_ref();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(level + 1);
        json_dump(items[i], indent, level + 1, item_sep, key_sep, sort_keys, ensure_ascii, out);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict_ref().items()) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(level + 1);
        const std::string& key = items[i]->first;
        if (!key.empty() && key[0] == '\0') {
          Value k = decode_key(key);  // json.dumps writes int/float/None keys as strings
          json_string(k.is_none() ? "null" : k.is_bool() ? (k.as_bool() ? "true" : "false") : k.to_str(), out,
                      ensure_ascii);
        } else {
          json_string(key, out, ensure_ascii);
        }
        out += key_sep;
        json_dump(items[i]->second, indent, level + 1, item_sep, key_sep, sort_keys, ensure_ascii, out);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    default: fail("jinja: Object of type ", v.type_name(), " is not JSON serializable");
  }
}
}  // namespace

std::string Value::to_json(int indent, const std::string& item_sep, const std::string& key_sep,
                           bool sort_keys, bool ensure_ascii) const {
  std::string out;
  json_dump(*this, indent, 0, item_sep, key_sep, sort_keys, ensure_ascii, out);
  return out;
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str_ref() == b.str_ref();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.list_ref();
      const auto& y = b.list_ref();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict_ref().size() != b.dict_ref().size()) return false;
      for (const auto& [k, v] : a.dict_ref().items()) {
        const Value* o = b.dict_ref().find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return a.dict_ptr() == b.dict_ptr();
    case Value::Kind::kCallable: return &a.callable_ref() == &b.callable_ref();
    default: return false;
  }
}

bool values_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str_ref() < b.str_ref();  // UTF-8 keeps code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list_ref();
    const auto& y = b.list_ref();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return values_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

}  // namespace astrai::tokenizer::jinja
