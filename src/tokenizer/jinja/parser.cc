#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <initializer_list>
#include <stdexcept>

#include "base/error.h"
#include "tokenizer/jinja/builtins.h"

namespace astrai::tokenizer::jinja {

namespace {

struct Token {
  enum Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Type type;
  std::string s;  // text, name, string value, operator
  Value num;
  int line = 1;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0 && is_ws(s[e - 1])) --e;
  return s.substr(0, e);
}

// jinja2's lexer, hand-written: the same decisions as its regexes for the default delimiters.
class Lexer {
 public:
  Lexer(const std::string& src, const LexOptions& opt) : src_(src), opt_(opt) {}

  std::vector<Token> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        advance_to(n);
        break;
      }
      char kind = src_[start + 1];
      char sign = (start + 2 < n && (src_[start + 2] == '-' || src_[start + 2] == '+')) ? src_[start + 2] : 0;
      // {% raw %} ... {% endraw %}: the body is text, verbatim.
      size_t raw_end = 0;
      bool raw = kind == '%' && match_raw_begin(start + 2 + (sign ? 1 : 0), &raw_end);
      std::string text = process_text(src_.substr(pos_, start - pos_), sign, kind != '{', pos_);
      emit_text(text, pos_);
      advance_to(start);
      if (raw) {
        lex_raw(raw_end);
        continue;
      }
      advance_to(start + 2 + (sign ? 1 : 0));
      if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind == '%');
      }
    }
    tokens_.push_back(Token{Token::kEof, "", {}, line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& what) { fail("jinja: ", what, " (template line ", line_, ")"); }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void advance_to(size_t p) {
    for (size_t i = pos_; i < p; ++i)
      if (src_[i] == '\n') ++line_;
    pos_ = p;
  }

  // Text before a tag: `-` strips all trailing whitespace; lstrip_blocks strips the spaces that
  // start the tag's line (block and comment tags only, not `{{`, not with `+`).
  std::string process_text(std::string text, char sign, bool is_block_or_comment, size_t text_start) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign != '+' && opt_.lstrip_blocks && is_block_or_comment) {
      bool line_starting = text_start == 0 || src_[text_start - 1] == '\n';
      size_t nl = text.rfind('\n');
      size_t l = nl == std::string::npos ? 0 : nl + 1;
      if ((l > 0 || line_starting) && l < text.size() &&
          std::all_of(text.begin() + l, text.end(), [](char c) { return is_ws(c); }))
        text.resize(l);
    }
    return text;
  }

  void emit_text(const std::string& text, size_t at) {
    if (text.empty()) return;
    // jinja normalizes newlines in template data to "\n".
    std::string norm;
    norm.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\r') {
        norm += '\n';
        if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
      } else {
        norm += text[i];
      }
    }
    int line = line_;
    for (size_t i = pos_; i < at; ++i)
      if (src_[i] == '\n') ++line;
    tokens_.push_back(Token{Token::kText, std::move(norm), {}, line});
  }

  bool match_raw_begin(size_t p, size_t* end) const {
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) return false;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_ws(src_[p])) ++p;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    *end = p;
    return true;
  }

  void lex_raw(size_t body_start) {
    advance_to(body_start);
    for (size_t i = body_start; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t p = i + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      size_t end;
      if (src_.compare(p, 3, "+%}") == 0) {
        end = p + 3;
      } else if (src_.compare(p, 3, "-%}") == 0) {
        end = p + 3;
        while (end < src_.size() && is_ws(src_[end])) ++end;
      } else if (src_.compare(p, 2, "%}") == 0) {
        end = p + 2;
        if (opt_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_text(process_text(src_.substr(body_start, i - body_start), sign, true, body_start), body_start);
      advance_to(end);
      return;
    }
    error("missing {% endraw %}");
  }

  void lex_comment() {
    size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) error("unterminated comment");
    size_t end = close + 2;
    if (close > pos_ && src_[close - 1] == '-') {
      while (end < src_.size() && is_ws(src_[end])) ++end;
    } else if (close > pos_ && src_[close - 1] == '+') {
    } else if (opt_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    advance_to(end);
  }

  void push(Token::Type t, std::string s = {}, Value num = {}) { tokens_.push_back(Token{t, std::move(s), std::move(num), line_}); }

  void lex_tag(bool block) {
    push(block ? Token::kBlockBegin : Token::kVarBegin);
    int depth = 0;
    const size_t n = src_.size();
    while (true) {
      while (pos_ < n && is_ws(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= n) error(block ? "unexpected end of template inside {% ... %}" : "unexpected end of template inside {{ ... }}");
      if (depth == 0) {
        if (block) {
          if (src_.compare(pos_, 3, "-%}") == 0) {
            push(Token::kBlockEnd);
            size_t e = pos_ + 3;
            while (e < n && is_ws(src_[e])) ++e;
            advance_to(e);
            return;
          }
          if (src_.compare(pos_, 3, "+%}") == 0) {
            push(Token::kBlockEnd);
            advance_to(pos_ + 3);
            return;
          }
          if (src_.compare(pos_, 2, "%}") == 0) {
            push(Token::kBlockEnd);
            size_t e = pos_ + 2;
            if (opt_.trim_blocks && e < n && src_[e] == '\n') ++e;
            advance_to(e);
            return;
          }
        } else {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            push(Token::kVarEnd);
            size_t e = pos_ + 3;
            while (e < n && is_ws(src_[e])) ++e;
            advance_to(e);
            return;
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            push(Token::kVarEnd);
            advance_to(pos_ + 2);
            return;
          }
        }
      }
      char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < n && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        push(Token::kName, src_.substr(pos_, e - pos_));
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "=", ";"};
        const char* found = nullptr;
        for (const char* op : kOps) {
          if (src_.compare(pos_, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        }
        if (!found) error(str_cat("unexpected character '", c, "'"));
        std::string op(found);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) error(str_cat("unexpected '", op, "'"));
          --depth;
        }
        push(Token::kOp, op);
        advance_to(pos_ + op.size());
      }
    }
  }

  void lex_number() {
    const size_t n = src_.size();
    size_t e = pos_;
    auto digits = [&]() {
      while (e < n && (std::isdigit(static_cast<unsigned char>(src_[e])) ||
                       (src_[e] == '_' && e + 1 < n && std::isdigit(static_cast<unsigned char>(src_[e + 1])))))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < n && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t m = e + 1;
      if (m < n && (src_[m] == '+' || src_[m] == '-')) ++m;
      if (m < n && std::isdigit(static_cast<unsigned char>(src_[m]))) {
        is_float = true;
        e = m;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    try {
      if (is_float)
        push(Token::kFloat, text, Value(std::stod(text)));
      else
        push(Token::kInt, text, Value(static_cast<int64_t>(std::stoll(text))));
    } catch (const std::out_of_range&) {
      error("number literal " + text + " out of range");
    }
    advance_to(e);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // String literals use Python's unicode-escape rules (jinja decodes them that way).
  void lex_string(char quote) {
    const size_t n = src_.size();
    size_t i = pos_ + 1;
    std::string out;
    while (true) {
      if (i >= n) error("unterminated string literal");
      char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        if (c == '\r') {  // newlines in literals are normalized too
          out += '\n';
          if (i + 1 < n && src_[i + 1] == '\n') ++i;
        } else {
          out += c;
        }
        ++i;
        continue;
      }
      if (i + 1 >= n) error("unterminated string literal");
      char e = src_[i + 1];
      i += 2;
      auto hex = [&](int count) -> uint32_t {
        if (i + count > n) error("truncated escape in string literal");
        uint32_t v = 0;
        for (int k = 0; k < count; ++k) {
          char h = src_[i + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) error("invalid escape in string literal");
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        i += count;
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': append_utf8(out, hex(8)); break;
        case 'N': error("\\N{...} escapes in string literals are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && i < n && src_[i] >= '0' && src_[i] <= '7'; ++k) v = v * 8 + (src_[i++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    push(Token::kString, std::move(out));
    advance_to(i + 1);
  }

  const std::string& src_;
  LexOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Program run() {
    Program p;
    p.body = subparse({});
    if (cur().type != Token::kEof) error("unexpected tag '" + cur().s + "'");
    return p;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  [[noreturn]] void error(const std::string& what) const { fail("jinja: ", what, " (template line ", cur().line, ")"); }
  bool is_op(const char* op) const { return cur().type == Token::kOp && cur().s == op; }
  bool is_name(const char* name) const { return cur().type == Token::kName && cur().s == name; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(str_cat("expected '", op, "', got ", describe(cur())));
    next();
  }
  void expect_name(const char* name) {
    if (!is_name(name)) error(str_cat("expected '", name, "', got ", describe(cur())));
    next();
  }
  std::string expect_identifier() {
    if (cur().type != Token::kName) error("expected a name, got " + describe(cur()));
    std::string s = cur().s;
    next();
    return s;
  }
  void expect_block_end() {
    if (cur().type != Token::kBlockEnd) error("expected end of statement block, got " + describe(cur()));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::kText: return "template text";
      case Token::kVarBegin: return "'{{'";
      case Token::kVarEnd: return "'}}'";
      case Token::kBlockBegin: return "'{%'";
      case Token::kBlockEnd: return "'%}'";
      case Token::kEof: return "end of template";
      case Token::kString: return "string literal";
      default: return "'" + t.s + "'";
    }
  }

  static ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static StmtPtr make_stmt(Stmt::Kind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  // Parses statements until a block tag whose first name is in `end`; leaves the stream on
  // that name (the `{%` consumed). With an empty `end`, parses to the end of the template.
  Body subparse(std::initializer_list<const char*> end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Token::kEof) {
        if (end.size() == 0) return body;
        std::string names;
        for (const char* e : end) names += std::string(names.empty() ? "" : " or ") + "'" + e + "'";
        error("unexpected end of template, expected " + names);
      }
      if (t.type == Token::kText) {
        auto s = make_stmt(Stmt::Kind::kText, t.line);
        s->text = t.s;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Token::kVarBegin) {
        next();
        auto s = make_stmt(Stmt::Kind::kOutput, t.line);
        s->expr = parse_tuple(false, true, false, {});
        if (cur().type != Token::kVarEnd) error("expected '}}', got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Token::kBlockBegin) {
        next();
        if (cur().type == Token::kName) {
          for (const char* e : end)
            if (cur().s == e) return body;
        }
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  Body parse_block_until(const char* end_name) {
    Body b = subparse({end_name});
    next();
    expect_block_end();
    return b;
  }

  StmtPtr parse_statement() {
    if (++depth_ > kMaxNesting) error("statements nested too deeply");
    struct Dec {
      int& d;
      ~Dec() { --d; }
    } dec{depth_};
    if (cur().type != Token::kName) error("expected a statement name, got " + describe(cur()));
    std::string name = cur().s;
    int line = cur().line;
    next();
    if (name == "if") return parse_if(line);
    if (name == "for") return parse_for(line);
    if (name == "set") return parse_set(line);
    if (name == "macro") return parse_macro(line);
    if (name == "call") return parse_call_block(line);
    if (name == "filter") {
      auto s = make_stmt(Stmt::Kind::kFilterBlock, line);
      s->expr = parse_filter(nullptr, true);
      expect_block_end();
      s->body = parse_block_until("endfilter");
      return s;
    }
    if (name == "with") {
      auto s = make_stmt(Stmt::Kind::kWith, line);
      while (cur().type != Token::kBlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_identifier());
        expect_op("=");
        s->defaults.push_back(parse_expression(true));
      }
      expect_block_end();
      s->body = parse_block_until("endwith");
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error("'" + name + "' outside a loop");
      auto s = make_stmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
      expect_block_end();
      return s;
    }
    if (name == "generation") {  // transformers' AssistantTracker extension: renders its body
      auto s = make_stmt(Stmt::Kind::kScope, line);
      expect_block_end();
      s->body = parse_block_until("endgeneration");
      return s;
    }
    error("unsupported or unknown statement '" + name + "'");
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(Stmt::Kind::kIf, line);
    while (true) {
      s->conds.push_back(parse_tuple(false, false, false, {}));
      expect_block_end();
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
      std::string tag = cur().s;
      next();
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end();
        s->else_body = subparse({"endif"});
        next();
      }
      expect_block_end();
      return s;
    }
  }

  void parse_assign_names(std::vector<std::string>& out, const char* end_name) {
    bool paren = false;
    if (is_op("(")) {
      paren = true;
      next();
    }
    while (true) {
      out.push_back(expect_identifier());
      if (is_op(",")) {
        next();
        if ((end_name && is_name(end_name)) || is_op("=") || is_op(")")) break;
        continue;
      }
      break;
    }
    if (paren) expect_op(")");
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(Stmt::Kind::kFor, line);
    parse_assign_names(s->targets, "in");
    expect_name("in");
    s->expr = parse_tuple(false, false, false, {"recursive"});
    if (is_name("if")) {
      next();
      s->cond = parse_expression(true);
    }
    if (is_name("recursive")) error("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (cur().s == "else") {
      next();
      expect_block_end();
      s->else_body = subparse({"endfor"});
    }
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    std::vector<std::string> targets;
    std::string attr;
    std::string first = expect_identifier();
    if (is_op(".")) {
      next();
      attr = expect_identifier();
      targets.push_back(first);
    } else {
      targets.push_back(first);
      while (is_op(",")) {
        next();
        if (is_op("=")) break;
        targets.push_back(expect_identifier());
      }
    }
    if (is_op("=")) {
      next();
      auto s = make_stmt(Stmt::Kind::kSet, line);
      s->targets = std::move(targets);
      s->attr = attr;
      s->expr = parse_tuple(false, true, false, {});
      expect_block_end();
      return s;
    }
    if (targets.size() != 1) error("block set takes a single target");
    auto s = make_stmt(Stmt::Kind::kSetBlock, line);
    s->targets = std::move(targets);
    s->attr = attr;
    if (is_op("|")) s->expr = parse_filter(nullptr, false);
    expect_block_end();
    s->body = parse_block_until("endset");
    return s;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.targets.empty()) expect_op(",");
      if (is_op(")")) break;
      s.targets.push_back(expect_identifier());
      if (is_op("=")) {
        next();
        s.defaults.push_back(parse_expression(true));
      } else {
        if (!s.defaults.empty() && s.defaults.back()) error("non-default argument follows default argument");
        s.defaults.push_back(nullptr);
      }
    }
    next();
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(Stmt::Kind::kMacro, line);
    s->name = expect_identifier();
    parse_params(*s);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_block_until("endmacro");
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(Stmt::Kind::kCallBlock, line);
    if (is_op("(")) parse_params(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::kCall) error("expected a call in {% call %}");
    expect_block_end();
    s->body = parse_block_until("endcall");
    return s;
  }

  // ---- expressions (jinja2.parser precedence) ----

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      next();
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (is_name("else")) {
        next();
        expr3 = parse_condexpr();
      }
      auto e = make(Expr::Kind::kCondExpr, line);
      e->children.push_back(std::move(expr2));
      e->children.push_back(std::move(expr1));
      e->children.push_back(std::move(expr3));
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::kBinary, line);
    e->name = op;
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (is_name("or")) {
      next();
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (is_name("and")) {
      next();
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      int line = cur().line;
      next();
      auto e = make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Token::kOp &&
          (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == "<=" || cur().s == ">" || cur().s == ">=")) {
        op = cur().s;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Token::kName && peek().s == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, line);
        cmp->children.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().s;
      next();
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      next();
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().s;
      next();
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      next();
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    // Nesting bound: the parser recurses per bracket/unary level (a stack overflow otherwise).
    if (++depth_ > kMaxNesting) error("expression nested too deeply");
    struct Dec {
      int& d;
      ~Dec() { --d; }
    } dec{depth_};
    int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      std::string op = cur().s;
      next();
      node = make(Expr::Kind::kUnary, line);
      node->name = op;
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Token::kName) {
      auto e = make(Expr::Kind::kLiteral, line);
      if (t.s == "true" || t.s == "True") {
        e->value = Value(true);
      } else if (t.s == "false" || t.s == "False") {
        e->value = Value(false);
      } else if (t.s == "none" || t.s == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.s;
      }
      next();
      return e;
    }
    if (t.type == Token::kString) {
      std::string s;
      while (cur().type == Token::kString) {
        s += cur().s;
        next();
      }
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Token::kInt || t.type == Token::kFloat) {
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = t.num;
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, true, {});
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(Expr::Kind::kList, line);
      while (!is_op("]")) {
        if (!e->children.empty()) expect_op(",");
        if (is_op("]")) break;
        e->children.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        if (!e->children.empty()) expect_op(",");
        if (is_op("}")) break;
        e->children.push_back(parse_expression(true));
        expect_op(":");
        e->children.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    error("unexpected " + describe(t));
  }

  bool is_tuple_end(const std::vector<const char*>& extra_end) const {
    if (cur().type == Token::kVarEnd || cur().type == Token::kBlockEnd || cur().type == Token::kEof || is_op(")"))
      return true;
    for (const char* n : extra_end)
      if (is_name(n)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, bool explicit_parens, std::vector<const char*> extra_end) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) error("expected an expression, got " + describe(cur()));
    }
    auto e = make(Expr::Kind::kTuple, line);
    e->children = std::move(args);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    int line = cur().line;
    if (is_op(".")) {
      next();
      if (cur().type == Token::kName) {
        auto e = make(Expr::Kind::kGetAttr, line);
        e->name = cur().s;
        e->children.push_back(std::move(node));
        next();
        return e;
      }
      if (cur().type == Token::kInt) {
        auto e = make(Expr::Kind::kGetItem, line);
        e->children.push_back(std::move(node));
        auto idx = make(Expr::Kind::kLiteral, line);
        idx->value = cur().num;
        e->children.push_back(std::move(idx));
        next();
        return e;
      }
      error("expected a name after '.'");
    }
    expect_op("[");
    std::vector<ExprPtr> items;
    while (!is_op("]")) {
      if (!items.empty()) expect_op(",");
      items.push_back(parse_subscribed());
    }
    next();
    if (items.size() == 1 && items[0]->kind == Expr::Kind::kSlice) {
      items[0]->children[0] = std::move(node);
      return std::move(items[0]);
    }
    auto e = make(Expr::Kind::kGetItem, line);
    e->children.push_back(std::move(node));
    if (items.size() == 1) {
      e->children.push_back(std::move(items[0]));
    } else {
      for (auto& it : items)
        if (it->kind == Expr::Kind::kSlice) error("multi-dimensional slicing is not supported");
      auto tup = make(Expr::Kind::kTuple, line);
      tup->children = std::move(items);
      e->children.push_back(std::move(tup));
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto e = make(Expr::Kind::kSlice, line);
    e->children.push_back(nullptr);  // the sliced object, filled by the caller
    e->children.push_back(std::move(start));
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) step = parse_expression(true);
    }
    e->children.push_back(std::move(stop));
    e->children.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty()) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) error("*args / **kwargs in calls are not supported");
      if (cur().type == Token::kName && peek().type == Token::kOp && peek().s == "=") {
        e.kwnames.push_back(cur().s);
        next();
        next();
        e.args.push_back(parse_expression(true));
      } else {
        if (!e.kwnames.empty()) error("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::kCall, cur().line);
    e->children.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      int line = cur().line;
      std::string name = expect_identifier();
      while (is_op(".")) {
        next();
        name += "." + expect_identifier();
      }
      auto e = make(Expr::Kind::kFilter, line);
      e->name = name;
      e->unknown = !has_filter(name);
      e->children.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = cur().line;
    next();  // 'is'
    bool negated = false;
    if (is_name("not")) {
      negated = true;
      next();
    }
    std::string name = expect_identifier();
    while (is_op(".")) {
      next();
      name += "." + expect_identifier();
    }
    auto e = make(Expr::Kind::kTest, line);
    e->name = name;
    e->unknown = !has_test(name);
    e->negated = negated;
    e->children.push_back(std::move(node));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Token::kName || cur().type == Token::kString || cur().type == Token::kInt ||
                cur().type == Token::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("you cannot chain multiple tests with 'is'");
      ExprPtr arg = parse_primary();
      e->args.push_back(parse_postfix(std::move(arg)));
    }
    return e;
  }

  static constexpr int kMaxNesting = 200;
  std::vector<Token> t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

// jinja2 rejects an unknown filter or test when it compiles the template, except inside an
// {% if %} (test, branches) or a conditional expression (a "soft" frame), where it raises only
// if evaluated. Loop, macro, call, set/filter-block and with bodies start a new, hard frame.
void check_expr(const Expr* e, bool soft) {
  if (!e) return;
  if (e->unknown && !soft)
    fail("jinja: unsupported or unknown ", e->kind == Expr::Kind::kFilter ? "filter" : "test", " '", e->name,
         "' (template line ", e->line, ")");
  bool inner = soft || e->kind == Expr::Kind::kCondExpr;
  for (const auto& c : e->children) check_expr(c.get(), inner);
  for (const auto& c : e->args) check_expr(c.get(), inner);
}

void check_body(const Body& body, bool soft) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::kIf:
        for (const auto& c : s->conds) check_expr(c.get(), true);
        for (const auto& b : s->bodies) check_body(b, true);
        check_body(s->else_body, true);
        break;
      case Stmt::Kind::kFor:
        check_expr(s->expr.get(), soft);
        check_expr(s->cond.get(), false);
        check_body(s->body, false);
        check_body(s->else_body, false);
        break;
      case Stmt::Kind::kMacro:
        for (const auto& d : s->defaults) check_expr(d.get(), false);
        check_body(s->body, false);
        break;
      case Stmt::Kind::kCallBlock:
        check_expr(s->expr.get(), soft);
        check_body(s->body, false);
        break;
      case Stmt::Kind::kSetBlock:
      case Stmt::Kind::kFilterBlock:
        check_expr(s->expr.get(), soft);
        check_body(s->body, false);
        break;
      case Stmt::Kind::kWith:
        for (const auto& d : s->defaults) check_expr(d.get(), soft);
        check_body(s->body, false);
        break;
      case Stmt::Kind::kScope: check_body(s->body, soft); break;
      default:
        check_expr(s->expr.get(), soft);
        break;
    }
  }
}

}  // namespace

Program parse_template(const std::string& source, const LexOptions& options) {
  // jinja first rewrites every \r\n and \r of the source as \n (so trim_blocks sees them),
  // then, with keep_trailing_newline=False, drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(src, options);
  Parser parser(lexer.run());
  Program program = parser.run();
  check_body(program.body, false);
  return program;
}

}  // namespace astrai::tokenizer::jinja
