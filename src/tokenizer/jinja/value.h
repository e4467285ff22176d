// Jinja values: the Python object model that chat templates see, reduced to what they use.
// Lists, dicts and namespaces are shared by reference (as Python objects are), so that
// `ns.x = ...` inside a loop is visible after it. Strings are UTF-8; lengths, indices and
// slices count code points, as Python's str does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace astrai::tokenizer::jinja {

class Value;
class Interpreter;

// An insertion-ordered dict with string keys (JSON objects and template dict literals).
class Dict {
 public:
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value value);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> items_;
  std::unordered_map<std::string, size_t> index_;
};

// Call arguments: positional values then keyword values (in call order).
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFunction = std::function<Value(Interpreter&, Args&)>;

struct Callable {
  std::string name;
  NativeFunction fn;
};

class Value {
 public:
  // kGenerator: what jinja's map/select/reject/unique/batch/items filters return in Python: an
  // iterator (always truthy, no len(), not printable, not JSON), kept so templates behave alike.
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable, kGenerator };

  Value() = default;  // Undefined.
  static Value undefined(std::string name = {});
  static Value none();
  Value(bool b);  // NOLINT: implicit, like Python literals.
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value generator(std::vector<Value> items);
  // markupsafe.Markup: what |safe and |escape return. `Markup + str` HTML-escapes the str.
  static Value markup(std::string s);
  static Value dict();
  static Value dict(std::shared_ptr<Dict> d);
  static Value ns();
  static Value callable(std::string name, NativeFunction fn);
  // JSON → Value; objects keep their key order (use nlohmann::ordered_json to keep the input's).
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_generator() const { return kind_ == Kind::kGenerator; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_float() const;  // any number
  const std::string& str_ref() const { return s_; }  // strings; Undefined's name
  const std::vector<Value>& list_ref() const { return *list_; }
  std::vector<Value>& list_mut() { return *list_; }
  const Dict& dict_ref() const { return *dict_; }
  Dict& dict_mut() { return *dict_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const Callable& callable_ref() const { return *callable_; }

  // Python truthiness.
  bool truthy() const;
  // Python str(): what {{ x }} and `~` print. Undefined prints as "".
  std::string to_str() const;
  // Python repr(): used inside printed lists/dicts.
  std::string repr() const;
  // Python-visible type name, for error messages.
  const char* type_name() const;

  // json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...): HF's tojson.
  // indent < 0 means None. Throws astrai::Error for values JSON cannot hold.
  std::string to_json(int indent, const std::string& item_sep, const std::string& key_sep,
                      bool sort_keys, bool ensure_ascii = false) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  bool markup_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> callable_;
};

// Python semantics helpers shared by the evaluator and the builtins.
bool values_equal(const Value& a, const Value& b);
// a < b as Python compares them; throws astrai::Error for unorderable types.
bool values_less(const Value& a, const Value& b);
std::string python_float_repr(double v);
// Dict keys: strings as is; other hashable keys (int, float, bool, None) are encoded into a
// string starting with '\0' that keeps their type. encode_key fails on unhashable values.
// dict_find/dict_set match keys as Python does (1 == 1.0 == True; the first key object stays).
std::string encode_key(const Value& k);
Value decode_key(const std::string& k);
const Value* dict_find(const Dict& d, const Value& key);
void dict_set(Dict& d, const Value& key, Value value);
std::string python_str_repr(const std::string& s);
// markupsafe.escape: & < > " ' as entities.
std::string html_escape(const std::string& s);
// UTF-8 helpers (code points, as Python indexes str).
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace astrai::tokenizer::jinja
