// Jinja lexer and parser: template source → Program. Follows jinja2 3.1's lexer (whitespace
// control, trim_blocks, lstrip_blocks, raw blocks, bracket balancing) and its expression grammar
// and precedence. Syntax we do not support throws astrai::Error naming it and the line.
#pragma once

#include <string>

#include "tokenizer/jinja/ast.h"

namespace astrai::tokenizer::jinja {

struct LexOptions {
  bool trim_blocks = true;   // HF: drop the first newline after a block tag
  bool lstrip_blocks = true; // HF: strip spaces/tabs before a block tag on its line
  bool keep_trailing_newline = false;
};

Program parse_template(const std::string& source, const LexOptions& options);

}  // namespace astrai::tokenizer::jinja
