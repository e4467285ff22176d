// Jinja builtins: filters, tests, and the methods of str/list/dict that templates call.
#pragma once

#include <string>

#include "tokenizer/jinja/value.h"

namespace astrai::tokenizer::jinja {

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
// Applies filter `name` to value with args. Throws astrai::Error on bad arguments.
Value apply_filter(Interpreter& in, const std::string& name, const Value& value, Args& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& value, Args& args);
// obj.name as a bound method (str.strip, dict.items, ...); Undefined when obj has no such method.
Value get_method(const Value& obj, const std::string& name);

// Python's `fmt % args` (the `format` filter): %s %r %d %i %f %x %% with flags/width/precision.
std::string python_percent_format(const std::string& fmt, const std::vector<Value>& args);

// Argument binding: positional index or keyword name, with a default when absent.
const Value* find_arg(const Args& args, size_t pos, const char* name);
Value arg_or(const Args& args, size_t pos, const char* name, Value fallback);

}  // namespace astrai::tokenizer::jinja
