#!/usr/bin/python3
"""Jinja feature cases: expected outputs in jinja_cases.json are Python jinja2's (HF setup).

  jinja_oracle.py            check jinja_cases.json against jinja2 (fails if any expectation is stale)
  jinja_oracle.py --write    regenerate the expectations from jinja2

jinja_test.cc renders the same cases with our interpreter and compares with these expectations,
so the C++ unit test is pinned to what the real jinja2 does.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_oracle import hf_environment  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "jinja_cases.json")

# (template, context). Expectation: rendered text, or {"error": true} when jinja2 raises.
SNIPPETS = [
    # output and literals
    ("{{ 1 }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e-5 }}|{{ 1e16 }}|{{ 123456789.0 }}|{{ -0.0 }}", {}),
    ("{{ none }}|{{ None }}|{{ true }}|{{ False }}|{{ undefined_var }}|", {}),
    ("{{ 'a\\nb\\t\\'\\\"\\\\' }}|{{ \"x\" 'y' }}|{{ '\\u00e9\\x41' }}", {}),
    ("{{ [1, 'a', none, true, 2.5, [], {}] }}", {}),
    ("{{ {'k': 'v', 'n': [1, {'x': none}]} }}", {}),
    ("{{ ('a',) }}|{{ (1, 2) }}|{{ () }}", {}),
    ("{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'é😀'] }}", {}),
    # arithmetic and operators
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }}", {}),
    ("{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 1 ~ 2 ~ 'x' ~ none }}", {}),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ not 1 }}", {}),
    ("{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ '' or [] }}|{{ none and 1 }}", {}),
    ("{{ 'yes' if x else 'no' }}|{{ 'yes' if y }}|{{ 1 if 0 else 2 if 0 else 3 }}", {"x": 1}),
    ("{{ -x|abs }} {{ -(3) }} {{ +4 }} {{ - 2 ** 2 }}", {"x": 5}),
    # subscripts and slicing
    ("{{ s[0] }}{{ s[-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ s[-2:] }}|{{ s[:-1] }}|{{ s[10:] }}", {"s": "héllo😀"}),
    ("{{ l[1:] }}|{{ l[:1] }}|{{ l[::-1] }}|{{ l[-1] }}|{{ l[5] }}|{{ l[1::2] }}", {"l": [1, 2, 3, 4]}),
    ("{{ d.a }}|{{ d['a'] }}|{{ d.missing }}|{{ d.b.c }}|{{ d['b']['c'] }}|{{ l.0 }}", {"d": {"a": 1, "b": {"c": 2}}, "l": [9]}),
    ("{{ d.items is callable }}|{{ d['items'] }}", {"d": {"items": 1}}),
    ("{{ undefined_thing.attr }}", {}),
    ("{{ none_value.attr }}|{{ none_value['x'] }}", {"none_value": None}),
    # statements
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"b": 1}),
    ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}:{{ x }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in xs if x is odd %}{{ x }}{{ loop.last }}{% else %}empty{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}", {}),
    ("{% for c in 'héy' %}[{{ c }}]{% endfor %}{% for x in undefined_var %}never{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for i in [1, 2] %}{{ x|default('u') }}{% set x = i %}{% endfor %}|{% set y = 'o' %}{% for i in [1, 2] %}{{ y }}{% set y = i %}{% endfor %}{{ y }}", {}),
    ("{% set y = 'early' %}{% macro m() %}{{ y }}{% endmacro %}{% set y = 'late' %}{{ m() }}|{% if true %}{% set w = 3 %}{% endif %}{{ w }}", {}),
    ("{{ 10 / 4 }} {{ 3 * 1.5 }} {{ 1 + true }} {{ 0.1 * 3 }} {{ 1 / 3 }} {{ 2.0 ** 0.5 }} {{ 100000000000000000.0 }}", {}),
    ("{{ {'b': 1, 'a': 2}|tojson(sort_keys=True) }}{{ [1, [2, [3]]]|tojson(indent=1) }}{{ {'a': 1}|tojson(separators=(',', ':')) }}{{ x|tojson(ensure_ascii=True) }}", {"x": "é😀"}),
    ("{{ '%05.1f'|format(3.14159) }}|{{ '%x'|format(255) }}|{{ '%s and %r'|format('a', 'b') }}", {}),
    ("{% set ns = namespace(x=1, l=[]) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{% set c, d = t %}{{ c }}{{ d }}", {}),
    ("{% set block %}  inner {{ 1 + 1 }}  {% endset %}[{{ block }}]{% set up | upper %}abc{% endset %}{{ up }}", {}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} [{{ greet() }}]", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body{% endcall %}", {}),
    ("{% macro row(x) %}{{ caller(x * 2) }}{% endmacro %}{% call(v) row(21) %}v={{ v }}{% endcall %}", {}),
    ("{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}", {}),
    ("{# comment #}x{# multi\nline #}y", {}),
    # whitespace control, trim_blocks, lstrip_blocks
    ("a\n  {% if true %}\n    b\n  {% endif %}\nc\n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("x {{- ' y ' -}} z", {}),
    ("  {%+ if true %}kept{% endif %}\n{% if true +%}\nnl kept{% endif %}", {}),
    ("line\n    {# comment #}\nnext", {}),
    ("{% for i in [1,2] %}\n  - {{ i }}\n{% endfor %}\n", {}),
    ("\t{% set x = 1 %}\t\n{{ x }}  {{ x }}\n  {{ x }}", {}),
    ("text\r\nwith crlf\r\n{% if true %}\r\nok{% endif %}", {}),
    # filters
    ("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'é\"\\n'|tojson }}|{{ [1.5, none, true]|tojson }}|{{ d|tojson(sort_keys=true) }}", {"d": {"b": [1, {}], "a": "x", "c": {}}}),
    ("{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'aBc'|upper }}{{ 'AbC'|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello wORLD-foo (bar'|title }}", {}),
    ("{{ [1, 2, 3]|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }} {{ undefined_var|length }}", {}),
    ("{{ [3, 1, 2]|first }}{{ [3, 1, 2]|last }}{{ 'abc'|first }}{{ []|first }}", {}),
    ("{{ [1, 2, 3]|join(', ') }}|{{ users|join(',', attribute='name') }}|{{ 'abc'|join('-') }}", {"users": [{"name": "a"}, {"name": "b"}]}),
    ("{{ x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|d('n') }}|{{ 0|d('z', boolean=true) }}", {}),
    ("{{ 'aaa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|replace('', '-') }}", {}),
    ("{{ 3|string }}{{ none|string }}|{{ '42'|int + 1 }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ 3.9|int }}|{{ '2.5'|float }}|{{ 2|float }}", {}),
    ("{{ 'abc'|list }}|{{ {'a': 1, 'b': 2}|list }}|{{ d|items|list }}|{{ d|dictsort }}|{{ d|dictsort(reverse=true) }}", {"d": {"b": 1, "A": 2, "a": 3}}),
    ("{{ users|selectattr('active')|map(attribute='name')|list }}|{{ users|rejectattr('active')|map(attribute='name')|join }}|{{ users|selectattr('role', 'equalto', 'x')|list|length }}", {"users": [{"name": "a", "active": True, "role": "x"}, {"name": "b", "active": False, "role": "y"}]}),
    ("{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3, 4]|reject('even')|list }}|{{ [0, 1, '', 'a']|select|list }}|{{ ['a', 'B']|map('upper')|list }}", {}),
    ("{{ items|map(attribute='function.name')|list }}|{{ items|map(attribute='x', default='-')|list }}", {"items": [{"function": {"name": "f"}}, {"function": {"name": "g"}, "x": 1}]}),
    ("{{ ['b', 'A', 'a', 'B']|unique|list }}|{{ ['b', 'A', 'a']|sort }}|{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}|{{ [3, 1, 2]|sort(reverse=true) }}", {}),
    ("{{ users|sort(attribute='age')|map(attribute='name')|join }}|{{ users|max(attribute='age') }}|{{ [3, 9, 1]|min }}|{{ ['b', 'C']|max }}", {"users": [{"name": "x", "age": 3}, {"name": "y", "age": 1}]}),
    ("{{ [1, 2, 3]|sum }}|{{ [1.5, 2]|sum }}|{{ users|sum(attribute='n') }}|{{ -3|abs }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.567|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ 7|round }}", {"users": [{"n": 1}, {"n": 2}]}),
    ("{{ 'abc'|reverse }}|{{ [1, 2]|reverse|list }}|{{ [1, 2, 3, 4, 5]|batch(2)|list }}|{{ [1, 2, 3]|batch(2, 'x')|list }}", {}),
    ("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x'|indent('> ', first=true) }}", {}),
    ("[{{ 'ab'|center(7) }}]|{{ 'one two  three'|wordcount }}|{{ '<b>bold</b>  text'|striptags }}|{{ '<a href=\"x\">&</a>'|e }}|{{ '%s-%d'|format('a', 3) }}", {}),
    ("{{ x|safe + '<b>' }}|{{ '<b>' + x|safe }}|{{ (x|safe ~ '<i>') }}|{{ x|e is escaped }}", {"x": "<tag>"}),
    ("{{ users|selectattr('name', 'in', ['a', 'c'])|map(attribute='name')|list }}|{{ d|attr('k') }}", {"users": [{"name": "a"}, {"name": "b"}], "d": {"k": 1}}),
    ("{{ xs|map('tojson')|join(',') }}|{{ xs|map('string')|list }}", {"xs": [1, "a", None]}),
    # tests
    ("{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.0 is integer }}{{ 1 is integer }}{{ true is boolean }}{{ 1.5 is float }}", {"x": 1}),
    ("{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is sequence }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}", {}),
    ("{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 'a' is in 'abc' }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ x is not none }}", {"x": 1}),
    ("{{ range is callable }}{{ 1 is sameas 1 }}{{ none is sameas none }}{{ 'upper' is filter }}{{ 'odd' is test }}", {}),
    # methods
    ("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}", {}),
    ("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'Abc'.upper() }}{{ 'Abc'.lower() }}{{ 'a-b'.replace('-', '+') }}{{ 'héllo'.find('l') }}{{ 'abc'.find('z') }}{{ 'aaa'.count('a') }}", {}),
    ("{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ '{} and {}'.format(1, 'x') }}|{{ '{0}{name}'.format('a', name='b') }}|{{ ', '.join(['a', 'b']) }}|{{ 'a\\nb'.splitlines() }}", {}),
    ("{{ d.get('a') }}|{{ d.get('z') }}|{{ d.get('z', 5) }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.items()|list }}", {"d": {"a": 1, "b": [2]}}),
    ("{{ [1, 2, 2].count(2) }}{{ [1, 2].index(2) }}", {}),
    ("{% set l = [1] %}{% set _ = l.append(2) %}{{ l }}", {}),
    ("{% set d = {} %}{% set _ = d.update({'a': 1}) %}{{ d }}", {}),
    # globals
    ("{{ range(3)|list }}|{{ range(1, 7, 2)|list }}|{{ range(5, 0, -2)|list }}|{{ dict(a=1, b='x') }}|{{ namespace(a=1).a }}", {}),
    ("{{ raise_exception('boom') }}", {}),
    ("{% for x in range(2) %}{{ x }}{% endfor %}{{ strftime_now('%Y') is string }}", {}),
    # dict keys other than strings, generators
    ("{% set d = {1: 'one', 2.0: 'two', none: 'n'} %}{{ d[1] }}{{ d[2] }}{{ d[none] }}{{ d }}|{{ d|tojson }}|{% for k in d %}{{ k }},{% endfor %}{{ 1 in d }}{{ 1.0 in d }}{{ 3 in d }}", {}),
    ("{% if xs|select('odd') %}truthy{% endif %}|{{ xs|select('odd')|list|length }}", {"xs": [2, 4]}),
    ("{{ xs|select('odd')|length }}", {"xs": [1]}),
    ("{{ none|select|list }}|{{ none|map(attribute='x')|list }}", {}),
    # errors jinja2 raises
    ("{{ 1 + 'a' }}", {}),
    ("{{ undefined_var + 1 }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{% for x in 1 %}{% endfor %}", {}),
    ("{{ x|nosuchfilter }}", {}),
    ("{% if false %}{{ x|nosuchfilter }}{% endif %}ok", {}),
    ("{{ x is nosuchtest }}", {}),
    ("{% if true %}{{ x is nosuchtest }}{% endif %}", {}),
    ("{% if x %}", {}),
    ("{% for %}{% endfor %}", {}),
    ("{% include 'other.html' %}", {}),
    ("{{ 'unterminated }}", {}),
    ("{% set ns = {} %}{% set ns.a = 1 %}", {}),
    ("{{ [1, 2]|tojson(indent=undefined_var) }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("{{ 'a' < 1 }}", {}),
]


def render(env, source, context):
    try:
        return env.from_string(source).render(**context)
    except Exception:  # noqa: BLE001 - any jinja2 failure is an expected error
        return None


def main():
    env = hf_environment()
    cases = []
    for source, context in SNIPPETS:
        out = render(env, source, context)
        case = {"template": source, "context": context}
        if out is None:
            case["error"] = True
        else:
            case["expected"] = out
        cases.append(case)
    if "--write" in sys.argv:
        with open(CASES, "w", encoding="utf-8") as f:
            json.dump(cases, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {len(cases)} cases to {CASES}")
        return 0
    with open(CASES, encoding="utf-8") as f:
        stored = json.load(f)
    bad = [c["template"] for c, s in zip(cases, stored) if c != s]
    if len(stored) != len(cases) or bad:
        print(f"jinja_cases.json is stale vs jinja2 {len(bad)} case(s): {bad[:5]}; rerun with --write")
        return 1
    print(f"{len(cases)} jinja cases agree with jinja2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
