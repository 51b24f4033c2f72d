// Values of the Jinja interpreter used for chat templates, with Python's semantics (what
// Hugging Face's apply_chat_template gets from Jinja2): str() and repr() as Python prints them,
// truthiness, ==, ordering, and json.dumps for the tojson filter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace duet::jinja {

struct Value;
using ValueList = std::vector<Value>;

// A dict (insertion-ordered, as Python's) or a namespace's attributes.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The argument named `name`, or positional argument `pos` (if >= 0), or nullptr.
  const Value* get(const char* name, int pos) const;
};

using Function = std::function<Value(const CallArgs&)>;

struct Value {
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kFunction,
  };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<ValueList> list;  // kList, kTuple
  std::shared_ptr<ValueDict> dict;  // kDict, kNamespace (shared: namespaces are mutable)
  std::shared_ptr<Function> fn;     // kFunction

  static Value undefined() { return Value(); }
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(ValueList items = {});
  static Value make_tuple(ValueList items);
  static Value make_dict(ValueDict d = {});
  static Value make_namespace(ValueDict d = {});
  static Value function(Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kDict; }
};

// Python's type name of v ('str', 'int', 'list', 'dict', 'NoneType', 'Undefined', ...).
const char* type_name(const Value& v);
// str(v) as Jinja prints {{ v }}: None -> "None", True -> "True", 1.0 -> "1.0", undefined -> "".
std::string to_str(const Value& v);
// repr(v), as Python prints items of lists and dicts.
std::string repr(const Value& v);
// Python's float repr: shortest round trip, "1.0", "1e+20", "1.5e-05", "inf", "nan".
std::string float_repr(double v);
bool truthy(const Value& v);
// Python's ==, and ordering (<0, 0, >0); compare throws duet::Error for unordered types.
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);
double as_double(const Value& v);  // REQUIRES: is_number()

struct JsonOptions {
  int indent = -1;  // < 0: none
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator;  // defaults: ", " (no indent) or "," (indent)
  std::string key_separator = ": ";
};
// json.dumps(v, ...) as Python writes it. Throws duet::Error for undefined or functions.
std::string to_json(const Value& v, const JsonOptions& options);

// JSON (messages, tools) -> values: objects keep their key order.
Value from_json(const nlohmann::ordered_json& j);

}  // namespace duet::jinja
