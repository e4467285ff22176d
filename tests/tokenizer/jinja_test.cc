// Jinja interpreter: the feature cases of jinja_cases.json (expectations are Python jinja2's,
// regenerated and re-checked by jinja_oracle.py), plus error reporting and API behaviour.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "tokenizer/jinja/template.h"

namespace astrai::tokenizer::jinja {
namespace {

using OJson = nlohmann::ordered_json;

std::string render(const std::string& source, const OJson& ctx = OJson::object()) {
  return Template(source).render(Value::from_json(ctx));
}

std::string error_of(const std::string& source, const OJson& ctx = OJson::object()) {
  try {
    render(source, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Jinja, CasesMatchJinja2) {
  std::ifstream in(std::string(ASTRAI_TEST_DIR) + "/jinja_cases.json");
  ASSERT_TRUE(in) << "jinja_cases.json missing";
  std::stringstream ss;
  ss << in.rdbuf();
  OJson cases = OJson::parse(ss.str());
  ASSERT_GT(cases.size(), 100u);
  int checked = 0;
  for (const auto& c : cases) {
    const std::string source = c["template"].get<std::string>();
    SCOPED_TRACE(source);
    if (c.contains("error")) {
      EXPECT_THROW(render(source, c["context"]), Error);
    } else {
      try {
        EXPECT_EQ(render(source, c["context"]), c["expected"].get<std::string>());
      } catch (const Error& e) {
        ADD_FAILURE() << "raised: " << e.what();
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

TEST(Jinja, UnsupportedFeaturesNameThemselvesAndTheLine) {
  EXPECT_NE(error_of("a\nb\n{% include 'x' %}").find("unsupported or unknown statement 'include' (template line 3)"),
            std::string::npos);
  EXPECT_NE(error_of("\n{{ x|nosuch }}").find("filter 'nosuch' (template line 2)"), std::string::npos);
  EXPECT_NE(error_of("{% for x in xs recursive %}{% endfor %}").find("recursive for loops are not supported"),
            std::string::npos);
  EXPECT_NE(error_of("{{ f(*args) }}").find("*args"), std::string::npos);
  EXPECT_NE(error_of("{{ '{:>4}'.format(1) }}").find("format specs"), std::string::npos);
  EXPECT_NE(error_of("{{ xs|map('upper') }}", {{"xs", {"a"}}}).find("generator"), std::string::npos);
}

TEST(Jinja, RuntimeErrorsCarryTheLine) {
  EXPECT_NE(error_of("x\n\n{{ raise_exception('no system role') }}").find("raise_exception: no system role (template line 3)"),
            std::string::npos);
  EXPECT_NE(error_of("{{ a.b.c }}").find("'a' is undefined"), std::string::npos);
  EXPECT_NE(error_of("\n{{ 1 + 'a' }}").find("(template line 2)"), std::string::npos);
  EXPECT_NE(error_of("{% if x %}").find("unexpected end of template, expected 'elif' or 'else' or 'endif'"),
            std::string::npos);
}

TEST(Jinja, ImmutableSandbox) {
  EXPECT_NE(error_of("{% set _ = xs.append(1) %}", {{"xs", OJson::array()}}).find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{% set _ = d.pop('a') %}", {{"d", {{"a", 1}}}}).find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ range(200000)|length }}").find("range too big"), std::string::npos);
}

TEST(Jinja, HostileTemplatesFailCleanly) {
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nested deeper"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 10 ** 18 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("{{ 'ab' * 10000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x'|center(10000000000) }}").find("too large"), std::string::npos);
  OJson deep = OJson::array();
  for (int i = 0; i < 600; ++i) deep = OJson::array({deep});
  EXPECT_THROW(Value::from_json(deep), Error);
}

TEST(Jinja, TrailingNewlineDroppedOnce) {
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
  LexOptions keep;
  keep.keep_trailing_newline = true;
  EXPECT_EQ(Template("x\n", keep).render(Value::dict()), "x\n");
}

TEST(Jinja, WithoutTrimOrLstrip) {
  LexOptions plain;
  plain.trim_blocks = false;
  plain.lstrip_blocks = false;
  EXPECT_EQ(Template("a\n  {% if true %}\nb{% endif %}\n", plain).render(Value::dict()), "a\n  \nb");
}

TEST(Jinja, ContextKeyOrderIsKept) {
  OJson ctx = OJson::parse(R"({"d": {"z": 1, "a": 2, "m": 3}})");
  EXPECT_EQ(render("{{ d|tojson }}{% for k in d %}{{ k }}{% endfor %}", ctx), "{\"z\": 1, \"a\": 2, \"m\": 3}zam");
}

TEST(Jinja, ValueReprMatchesPython) {
  EXPECT_EQ(python_float_repr(1e22), "1e+22");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(python_str_repr("a'b"), "\"a'b\"");
  EXPECT_EQ(python_str_repr("\x01\x7f"), "'\\x01\\x7f'");
}

TEST(Jinja, TemplatesCanBeRenderedManyTimes) {
  Template t("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  for (int i = 1; i < 5; ++i) {
    OJson ctx = {{"xs", OJson::array({i, i})}};
    EXPECT_EQ(t.render(Value::from_json(ctx)), std::to_string(2 * i));
  }
}

}  // namespace
}  // namespace astrai::tokenizer::jinja
