#!/usr/bin/env python3
"""The template engine, construct by construct, against jinja2.

    test_jinja.py RENDER

Table ORACLE: each (template, variables) is rendered by jinja_ref (jinja2 as transformers sets
it up) and by `RENDER TEMPLATE VARS.json NOW` (common/jinja.h alone); the outputs must be the
same bytes, or both must fail. Table REFUSED: constructs the engine refuses where jinja2
renders; the error must name the construct and its line. Table ERRORS: errors whose text
matters (raise_exception's message, the sandbox refusing list.append, limits).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["TZ"] = "UTC"
import time  # noqa: E402

time.tzset()
import jinja_ref  # noqa: E402

NOW = 1735732800  # 2025-01-01 12:00:00 UTC

ORACLE = [
    # text, whitespace control, trim_blocks and lstrip_blocks
    ("plain text", {}),
    ("a\n", {}),
    ("a\n\n", {}),
    ("a\r\nb\rc", {}),
    ("x  {{- 1 -}}  y", {}),
    ("x\n  {%- if true %}\n  y\n  {%- endif %}\nz", {}),
    ("  {% if true %}\nA\n  {% endif %}\nB", {}),
    ("  {%+ if true %}\nA\n  {% endif +%}\nB", {}),
    ("{# c #}\n  {# c2 #}\nx", {}),
    ("a {#- c -#} b", {}),
    ("{% raw %}{{ x }}{% endraw %}", {}),
    ("{% raw -%}  {{ x }}  {%- endraw %}", {}),
    ("  {{ 1 }}\n  {% set x = 2 %}\n{{ x }}", {}),
    ("{%- for i in range(3) %}\n  {{- i }}\n{%- endfor %}", {}),
    ("{{ {'a': {'b': 1}} }}", {}),
    ("\t{% if 1 %}\t\n{% endif %}", {}),
    ("\u00a0{% if 1 %}x{% endif %}", {}),
    # literals and printing
    ("{{ 1, 2 }}{{ (1,) }}{{ () }}{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}", {}),
    ("{{ \"it's\" }}{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', '\\x01', '\\u200b', 'é', '😀', '\\u00a0'] }}", {}),
    ("{{ 'a\\tb\\x41\\u00e9\\U0001F600\\101\\q' }}", {}),
    ("{{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("{{ '1_000.2_5'|float }} {{ ' -1_0e1_0 '|float }} {{ '1__0'|float }} {{ '_1'|float }} {{ '1_'|float }} {{ '1._5'|float }} {{ '.5e-1'|float }} {{ 'inf'|float }} {{ '1e'|float }}", {}),
    ("{{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 0.1+0.2 }} {{ 1.0 }} {{ -0.0 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e-7 }} {{ 123456789.0 * 1000 }}", {}),
    ("{{ 'a' * 3 }}{{ [1] * 2 }}{{ 3 * 'b' }}{{ true + 1 }}{{ [1] + [2] }}{{ (1,) + (2,) }}{{ -(3) }}{{ +3 }}{{ -true }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ [1] ~ x }}", {}),
    ("{{ x }}|{{ none }}|{{ true }}|{{ false }}|{{ 3.0 }}", {"x": 5}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 10 / 0 }}", {}),
    ("{{ 10 // 0 }}", {}),
    ("{{ 1 < 'a' }}", {}),
    # comparisons and logic
    ("{{ not none }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' in 'cat' }}{{ 'x' not in ['x'] }}{{ 1 in {1: 2} }}{{ 1.0 in [1] }}{{ true == 1 }}", {}),
    ("{{ [1,2] == [1,2] }}{{ (1,2) == [1,2] }}{{ {'a':1} == {'a':1} }}{{ none == none }}{{ x == y }}{{ 'b' > 'a' }}{{ [1,2] < [1,3] }}", {}),
    ("{{ true and 'x' }}{{ false or 0 }}{{ none or [] }}{{ 'a' and 'b' }}{{ 0 and x.y }}", {}),
    ("{{ 1 if true else 2 }}{{ 1 if false }}|{{ (1 if false) is defined }}", {}),
    ("{{ 'é' < 'z' }}{{ 'Z' < 'a' }}{{ '😀' > 'é' }}", {}),
    # variables, attributes, items, Undefined
    ("{{ a.b }}|{{ a['b'] }}|{{ a.c }}|{{ a.c is defined }}", {"a": {"b": 1}}),
    ("{{ a.b.c }}", {"a": {"b": None}}),
    ("{{ a.b.c }}", {"a": {}}),
    ("{{ x.y }}", {}),
    ("{{ x['y'] }}", {}),
    ("{{ x is defined }}{{ x is undefined }}{{ x|length }}{{ x|list }}{{ x|string }}|{{ x ~ 'a' }}{{ x|default('d') }}", {}),
    ("{% for i in x %}{{ i }}{% else %}empty{% endfor %}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ x.y is defined }}", {"x": {}}),
    ("{{ none.foo }}|{{ 'abc'.foo }}|{{ [1].foo }}", {}),
    ("{{ m[0].role }}{{ m[-1].role }}{{ m[5] }}|{{ m[5] is defined }}", {"m": [{"role": "u"}, {"role": "a"}]}),
    ("{{ m[5].role }}", {"m": []}),
    ("{{ m.0 }}{{ m.1.2 }}", {"m": [1, [1, 2, 3]]}),
    ("{{ d['items'] is defined }}{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}", {"d": {"a": 1}}),
    ("{{ d.items() }}|{{ d.keys() }}|{{ d.values() }}|{{ d.items()[0] }}|{{ d.items()|length }}", {"d": {"a": 1, "b": [2]}}),
    ("{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ 'abc'[5] }}{{ 'abcdef'[1:4] }}{{ 'abcdef'[::-1] }}{{ 'abcdef'[::2] }}{{ 'abcdef'[-2:] }}{{ 'abcdef'[5:1:-2] }}", {}),
    ("{{ [1,2,3][1:] }}{{ [1,2,3][:-1] }}{{ [1,2,3][::-1] }}{{ [1,2,3][10:] }}{{ (1,2,3)[1:] }}{{ 'héllo wörld'[1:8] }}{{ '日本語'[::-1] }}", {}),
    ("{{ 'abc'[::0] }}", {}),
    ("{{ [1,2][x:] }}|{{ [1,2][1.5:] }}", {}),
    ("{{ range(3) }}{{ range(1, 5, 2) }}{{ range(3)|list }}{{ range(5)[1:3] }}{{ range(5)[-1] }}{{ range(10, 0, -3)|list }}{{ 3 in range(5) }}", {}),
    ("{{ range(100001)|length }}", {}),
    # statements
    ("{% if false %}a{% elif x %}b{% elif true %}c{% else %}d{% endif %}", {}),
    ("{% for a, b in [[1,2],[3,4]] %}{{ a }}{{ b }}{% endfor %}{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}", {}),
    ("{% for a, b in [[1,2,3]] %}{{ a }}{% endfor %}", {}),
    ("{% for (a, (b, c)) in [[1, [2, 3]]] %}{{ a }}{{ b }}{{ c }}{% endfor %}", {}),
    ("{% for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{% else %}b{% endfor %}", {}),
    ("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", {}),
    ("{% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.depth }}{% endfor %}", {}),
    ("{% for x in [1,1,2] %}{{ loop.changed(x) }}{% endfor %}", {}),
    ("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% if x == 3 %}{% break %}{% endif %}{% endfor %}", {}),
    ("{% for c in 'héllo' %}{{ c }}.{% endfor %}{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}", {}),
    ("{% for i in [1] %}{{ loop }}{% endfor %}{{ loop }}", {}),
    ("{% for i in [1,2] %}{% for j in [3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
    ("{% for x in none %}{% endfor %}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = d = 3 %}", {}),
    ("{% set x %}a{{ 1 }}b{% endset %}{{ x }}|{{ x|length }}{% set y | upper | replace('A', '@') %}ab{% endset %}{{ y }}", {}),
    ("{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns }}", {}),
    ("{% set ns = namespace() %}{% set ns.b = 2 %}{{ ns.b }}{{ ns.c }}{{ ns['b'] }}", {}),
    ("{% set x = 5 %}{% set x.a = 1 %}", {}),
    ("{% macro m(a, b=a, c='z') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}{{ m() }}", {}),
    ("{% macro m(a) %}[{{ a }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ m(1, 2, k=3) }}", {}),
    ("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m(1, 2) }}", {}),
    ("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m(1, c=2) }}", {}),
    ("{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}in{% endcall %}", {}),
    ("{% macro m(n) %}{{ caller(n * 2) }}{% endmacro %}{% call(v) m(3) %}<{{ v }}>{% endcall %}", {}),
    ("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}", {}),
    ("{% macro m() %}x{% endmacro %}{{ m }}{{ m() | length }}", {}),
    ("{% filter upper %}ab{{ 'c' }}{% endfilter %}{% filter replace('A', 'b') | lower %}AAA{% endfilter %}", {}),
    ("{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}", {}),
    ("{% print 1, 'a' %}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    # scoping as jinja2 compiles it
    ("{% set x = 1 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}{{ y }}{% endfor %}", {}),
    ("{% macro m() %}{{ x }}{% endmacro %}{% set x = 3 %}{{ m() }}", {}),
    ("{% macro m() %}[{{ x }}]{% endmacro %}{{ m() }}{% set x = 3 %}{{ m() }}", {"x": 1}),
    ("{% macro m() %}[{{ x }}]{% endmacro %}{% if false %}{% set x = 3 %}{% endif %}{{ m() }}", {"x": 1}),
    ("{{ x }}{% set x = 3 %}{{ x }}", {"x": 1}),
    ("{% for i in [1] %}{{ x }}{% endfor %}{% set x = 3 %}", {"x": 1}),
    ("{% for i in [1, 2] %}{{ x }}{% set x = i %}{% endfor %}{% set x = 9 %}{{ x }}", {"x": "c"}),
    ("{% for i in [1] %}{% macro m() %}[{{ x }}]{% endmacro %}{{ m() }}{% set x = 3 %}{{ m() }}{% endfor %}", {"x": 1}),
    ("{% if a %}{% set x = 1 %}{% else %}{% set x = 2 %}{% endif %}{% for i in [1] %}{{ x }}{% endfor %}", {"a": True}),
    ("{% macro m() %}{{ y }}{% endmacro %}{% if a %}{% set y = 1 %}{% elif b %}{% set y = 2 %}{% else %}{% set y = 3 %}{% endif %}{{ m() }}", {"a": False, "b": True, "y": "ctx"}),
    ("{% macro m() %}{{ y }}{% endmacro %}{{ m() }}{% if a %}{% set y = 1 %}{% elif b %}{% set y = 2 %}{% else %}{% set y = 3 %}{% endif %}{{ m() }}", {"a": False, "b": True, "y": "ctx"}),
    ("{% for x in [] %}{% else %}{% set y = 1 %}{{ x }}{% endfor %}{{ y }}", {"x": 5}),
    ("{% set x %}{% set y = 1 %}{% endset %}{{ y }}", {}),
    ("{% set messages = messages[1:] %}{{ messages|length }}", {"messages": [1, 2, 3]}),
    # filters
    ("{{ -1|abs }}{{ -1.5|abs }}{{ [1,2,3]|batch(2)|list }}{{ [1,2,3]|batch(2, 0)|list }}{{ 'hELLO wORLD'|capitalize }}{{ 'ab'|center(6) }}|", {}),
    ("{{ x|default('d') }}{{ none|default('d') }}{{ none|default('d', true) }}{{ ''|d('e', boolean=true) }}{{ 0|default(5) }}", {}),
    ("{{ {'b': 1, 'a': 2, 'C': 0}|dictsort }}{{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}", {}),
    ("{{ '<a href=\"x\">&</a>'|e }}{{ '<b>'|safe }}{{ ('<b>'|safe) + '<i>' }}{{ '<i>' + ('<b>'|safe) }}{{ 5|escape }}", {}),
    ("{{ [3,1]|first }}{{ 'abc'|first }}{{ []|first }}|{{ [3,1]|last }}{{ 'héé'|last }}{{ {'a': 1, 'b': 2}|last }}", {}),
    ("{{ '42'|int }}{{ '4.7'|int }}{{ 'x'|int }}{{ '  12 '|int }}{{ '1_0'|int }}{{ 3.9|int }}{{ -3.9|int }}{{ '0x1A'|int(base=16) }}{{ '0b11'|int(0, 0) }}{{ 'x'|int(7) }}{{ true|int }}{{ none|int }}", {}),
    ("{{ '1e3'|float }}{{ 'x'|float }}{{ ' 1.5 '|float }}{{ '1_0.5'|float }}{{ 'inf'|float }}{{ '-nan'|float }}{{ 2|float }}{{ '0x10'|float }}{{ '.5'|float }}{{ '5.'|float }}", {}),
    ("{{ 2.5|round }}{{ 3.5|round }}{{ 2.675|round(2) }}{{ 5|round }}{{ 2.1|round(0, 'ceil') }}{{ -2.5|round }}{{ 1.25|round(1, 'floor') }}{{ 0.125|round(2) }}", {}),
    ("{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}|{{ 'a\\r\\nb\\u2028c'|indent }}", {}),
    ("{{ [1,2]|join }}{{ ['a','b']|join(', ') }}{{ [{'n': 1}, {'n': 2}]|join('-', attribute='n') }}{{ [1, none]|join('|') }}", {}),
    ("{{ 'abc'|length }}{{ [1,2]|count }}{{ {'a': 1}|length }}{{ 'héllo'|length }}{{ '😀👩‍💻'|length }}", {}),
    ("{{ 'abc'|list }}{{ {'a': 1}|list }}{{ (1, 2)|list }}", {}),
    ("{{ 'Hello World'|lower }}{{ 'ÉCOLE'|lower }}{{ 'straße'|length }}{{ 'école'|upper }}", {}),
    ("{{ {'a': 1}|items|list }}{{ x|items|list }}", {}),
    ("{{ [1,2]|map('string')|list }}{{ ['a','b']|map('upper')|join }}{{ [{'a': {'b': 3}}]|map(attribute='a.b')|list }}{{ [{}]|map(attribute='z', default='d')|list }}", {}),
    ("{{ [1,2,3,4]|select('odd')|list }}{{ [1,2,3,4]|reject('even')|list }}{{ [0, 1, '', 'a']|select|list }}{{ [1,2,3]|select('gt', 1)|list }}{{ [1,2,3]|select('in', [2,3])|list }}", {}),
    ("{{ u|selectattr('role', 'equalto', 'user')|list }}{{ u|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}{{ u|selectattr('x')|list }}{{ u|selectattr('role', 'defined')|list|length }}", {"u": [{"role": "user"}, {"role": "tool", "x": 1}]}),
    ("{{ [3,1,2]|sort }}{{ [3,1,2]|sort(reverse=true) }}{{ ['b','A','a']|sort }}{{ ['b','A','a']|sort(case_sensitive=true) }}{{ [{'n':'b'},{'n':'a'}]|sort(attribute='n') }}{{ [{'a':1,'b':2},{'a':1,'b':1}]|sort(attribute='a,b') }}", {}),
    ("{{ [1,1,2,'a','A']|unique|list }}{{ ['a','A']|unique(case_sensitive=true)|list }}{{ [{'x':1},{'x':1}]|unique(attribute='x')|list }}", {}),
    ("{{ 'ab'|reverse }}{{ [3,1,2]|reverse|list }}{{ {'a':1,'b':2}|reverse|list }}{{ [1,2]|select|reverse }}", {}),
    ("{{ [1, 2, 3]|sum }}{{ [1.5, 2]|sum }}{{ [{'p': 2}, {'p': 3}]|sum(attribute='p') }}{{ [[1], [2]]|sum(start=[]) }}{{ []|max }}{{ ['b','a']|max }}{{ ['B','a']|min }}{{ [{'v': 3}, {'v': 1}]|min(attribute='v') }}", {}),
    ("{{ 'Hello World'|wordcount }}{{ 'a-b c(d e[f g<h'|title }}{{ \"it's hello\"|title }}{{ 'x,y z_w 日本 é'|wordcount }}", {}),
    ("{{ 'a b'|replace(' ', '_') }}{{ 'aaa'|replace('a', 'b', 2) }}{{ 'ab'|replace('', '-') }}{{ 5|replace('5', 'five') }}", {}),
    ("{{ 1|string ~ none|string }}{{ [1]|string }}{{ 'x'|string }}", {}),
    ("{{ '%s-%d%%'|format('a', 3) }}", {}),
    ("{{ 'x'|tojson }}{{ {'a': [1, 2.0, none, true, 'é\"\\\\\\n\\u0001']}|tojson }}{{ {'a': 1, 'b': [1, {}]}|tojson(indent=2) }}", {}),
    ("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ 'é😀'|tojson(true) }}{{ [1, 2]|tojson(separators=(',', ':')) }}{{ {'a': []}|tojson(indent='\\t') }}{{ (1, 2)|tojson }}", {}),
    ("{{ {1: 2, none: 3, true: 4, 1.5: 5}|tojson }}", {}),
    ("{{ x|tojson }}", {}),
    ("{{ d|tojson }}{{ d|tojson(indent=1) }}", {"d": {"k": [1, {"x": None, "y": "\u2028"}], "e": {}, "l": []}}),
    ("{{ ns|tojson }}{% set ns = namespace() %}", {}),
    ("{{ f|tojson }}{{ f }}{{ i|tojson }}", {"f": 1.0e-7, "i": -(2**63)}),
    # tests
    ("{{ 5 is divisibleby 3 }}{{ 4 is even }}{{ 3 is odd }}{{ 'a' is in 'abc' }}{{ 1 is eq 1 }}{{ 1 is ne 1 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is lt 2 }}{{ 1 is le 0 }}{{ 1 is equalto 1 }}{{ 1 is sameas true }}", {}),
    ("{{ none is none }}{{ false is false }}{{ 0 is false }}{{ true is true }}{{ 1 is true }}{{ 'A' is upper }}{{ 'a' is lower }}{{ '' is lower }}{{ x is callable }}{{ range is callable }}{{ 'x' is not none }}", {}),
    ("{{ x is sequence }}{{ x is iterable }}{{ x is mapping }}{{ none is iterable }}{{ 'a' is sequence }}{{ {} is sequence }}{{ {} is iterable }}{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 'a' is string }}{{ {} is mapping }}", {}),
    ("{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}{{ ('a'|safe) is escaped }}{{ 'a' is escaped }}", {}),
    ("{% if x is defined and x is not none %}y{% else %}n{% endif %}", {"x": None}),
    # methods
    ("{{ '  a b  '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'ayy'.rstrip('y') }}|{{ '\\n a \\n'.strip('\\n') }}|{{ '\u3000a\u00a0'.strip() }}", {}),
    ("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b c '.split(maxsplit=1) }}{{ ' a b c '.rsplit(None, 1) }}{{ ''.split() }}{{ ''.split(',') }}", {}),
    ("{{ 'abc'.startswith(('x','a')) }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith('b', 1) }}{{ 'héllo'.find('l') }}{{ 'abcabc'.rfind('c') }}{{ 'abc'.count('') }}{{ 'aaa'.count('a', 1) }}{{ 'abc'.index('c') }}", {}),
    ("{{ 'abc'.index('z') }}", {}),
    ("{{ 'aBc'.upper() }}{{ 'abc def'.title() }}{{ 'ABC'.lower() }}{{ 'hello World'.capitalize() }}{{ 'aBc'.swapcase() }}{{ \"they're bill's\".title() }}", {}),
    ("{{ '-'.join(['a', 'b']) }}{{ ''.join('abc') }}{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'abc'.partition('x') }}", {}),
    ("{{ 'x'.join([1]) }}", {}),
    ("{{ 'prefix_x'.removeprefix('prefix_') }}{{ 'x.py'.removesuffix('.py') }}{{ 'ab'.ljust(4, '*') }}{{ 'ab'.rjust(4) }}{{ 'ab'.center(5, '.') }}{{ '-5'.zfill(4) }}", {}),
    ("{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'a1'.isalnum() }}{{ ' '.isspace() }}{{ 'ABC'.isupper() }}{{ 'abc'.islower() }}{{ ''.isdigit() }}{{ 'é'.isascii() }}{{ '日本'.isalpha() }}", {}),
    ("{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'a\\nb'.splitlines(true) }}", {}),
    ("{{ '{} and {}'.format(1, 'b') }}{{ '{0}{name}{0}'.format(1, name='n') }}{{ '{x[a]}|{y.b}'.format(x={'a': 1}, y={'b': 2}) }}{{ '{{}}{!r}'.format('q') }}", {}),
    ("{{ [1, 2, 1].count(1) }}{{ [1, 2].index(2) }}{{ (1, 2).index(1) }}{{ [1, 2].copy() }}{{ {'a': 1}.copy() }}", {}),
    ("{{ [1,2].append }}|{{ [1,2].append is defined }}", {}),
    # globals
    ("{{ dict(a=1, b='x') }}{{ dict({'a': 1}, b=2) }}{{ dict([('a', 1)]) }}{{ namespace({'a': 1}, b=2).a }}", {}),
    ("{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner('|') %}{{ j() }}a{{ j() }}b", {}),
    ("{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j %p %f [%z] [%Z] %d %b %Y %%') }}", {}),
    ("{{ range(1, 2, 0) }}", {}),
    ("{{ raise_exception('boom') }}", {}),
    # generators are one-pass
    ("{% set g = [1,2,3]|select('odd') %}{{ g|first }}{{ g|list }}{{ g|list }}", {}),
    ("{% set g = [1,2]|map('string') %}{% for x in g %}{{ x }}{% endfor %}{% for x in g %}{{ x }}{% endfor %}", {}),
    ("{{ [1]|select|length }}", {}),
    ("{% set g = [1, 2, 3]|select %}{{ 3 in g }}{{ g|list }}{{ 9 in ([1]|select) }}", {}),
    ("{{ [1, 2]|map('string') is iterable }}{{ ([1]|select) is sequence }}{% if [1]|reject %}t{% endif %}", {}),
]

# (template, variables, text the error must contain)
REFUSED = [
    ("a\n{{ x|xmlattr }}", {"x": {}}, "line 2: the filter 'xmlattr' is not supported"),
    ("\n\n{{ 'a'|wordwrap(5) }}", {}, "line 3: the filter 'wordwrap' is not supported"),
    ("{% include 'x.j2' %}", {}, "line 1: the tag 'include' is not supported"),
    ("x\n{% extends 'base' %}", {}, "line 2: the tag 'extends' is not supported"),
    ("{% for x in y recursive %}{% endfor %}", {}, "recursive for loops are not supported"),
    ("{{ f(*args) }}", {}, "*args and **kwargs in calls are not supported"),
    ("{{ 'ß'.upper() }}", {}, "changing the case of U+00DF is not supported"),
    ("{{ 'abc'.casefold() }}", {}, "'casefold' is not supported"),
    ("{{ [1, 2].pop() }}", {}, "'pop' is not supported"),
    ("{{ '%s' % 'x' }}", {}, "printf-style string formatting"),
    ("{{ {'a': 1}.items }}", {}, "not supported"),
    ("{{ [1]|reverse }}", {}, "not supported"),
    ("{{ 2**64 }}", {}, "beyond 64 bits"),
    ("{{ 2**62 * 2 }}", {}, "beyond 64 bits"),
    ("{{ 99999999999999999999 }}", {}, "beyond 64 bits"),
    ("{{ 'a'.real }}{{ (1).real }}", {}, "'real' is not supported"),
    ("{{ '{:>5}'.format(1) }}", {}, "format specs"),
    ("{% set g = [1, 2, 3]|select %}{{ 2 in g }}{{ g|list }}", {}, "part-way"),
    ("{% set g = [1, 2, 3]|select %}{% for x in g %}{% break %}{% endfor %}{{ g|list }}", {}, "part-way"),
]

# (template, variables, text the error must contain)
ERRORS = [
    ("line1\n{{ raise_exception('Conversation roles must alternate') }}", {}, "line 2: Conversation roles must alternate"),
    ("{{ messages.append(1) }}", {"messages": []}, "access to attribute 'append' of 'list' object is unsafe."),
    ("{{ {'a': 1}.update({}) }}", {}, "access to attribute 'update' of 'dict' object is unsafe."),
    ("{{ x.y }}", {}, "'x' is undefined"),
    ("{{ range(200000)|length }}", {}, "Range too big"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, "nested more than 64 deep"),
    ("{{ " + "(" * 100 + "1" + ")" * 100 + " }}", {}, "nested more than 64 deep"),
    ("{% if x %}", {}, "unexpected end of template"),
    ("{{ 'abc }}", {}, "unterminated string"),
    ("{{ x|nosuchfilter }}", {}, "no filter named 'nosuchfilter'"),
    ("{{ x is nosuchtest }}", {}, "no test named 'nosuchtest'"),
    ("{% break %}", {}, "'break' outside a for loop"),
    ("{% endfor %}", {}, "unknown tag 'endfor'"),
]

# The engine's own limits (jinja2 has none of these but would run for hours or exhaust memory):
# (template, variables, text the error must contain)
LIMITS = [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}", {}, "loop iterations (the limit)"),
    ("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", {}, "over the limit"),
    ("{% set s = 'ab' * 10000000 %}", {}, "over the limit"),
    ("{% set l = [1] * 100000000 %}", {}, "over the limit"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", {}, "over the limit"),
]

failed = 0
checks = 0


def check(cond, msg):
    global failed, checks
    checks += 1
    if not cond:
        failed += 1
        print("FAIL", msg)


def run_c(render, tmp, src, variables):
    tp, vp = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "v.json")
    with open(tp, "w", encoding="utf-8") as f:
        f.write(src)
    with open(vp, "w", encoding="utf-8") as f:
        json.dump(variables, f)
    p = subprocess.run([render, tp, vp, str(NOW)], capture_output=True, timeout=120, env=dict(os.environ, TZ="UTC"))
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def main():
    render = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="strata-jinja-")
    n_same = n_both = 0
    for src, variables in ORACLE:
        ok, ref = jinja_ref.render(src, variables, NOW)
        rc, out, err = run_c(render, tmp, src, variables)
        if ok:
            check(rc == 0 and out == ref, f"{src!r}: jinja2 {ref!r}, C rc={rc} {out!r} {err.strip()!r}")
            n_same += rc == 0 and out == ref
        else:
            check(rc != 0 and err.startswith("error: "), f"{src!r}: jinja2 raised {ref!r}, C rc={rc} {out!r}")
            n_both += rc != 0
    for src, variables, want in REFUSED:
        ok, ref = jinja_ref.render(src, variables, NOW)
        rc, out, err = run_c(render, tmp, src, variables)
        check(rc != 0 and want in err, f"refused {src!r}: want {want!r} in the error, got rc={rc} {err.strip()!r} {out!r}")
    for src, variables, want in ERRORS:
        ok, ref = jinja_ref.render(src, variables, NOW)
        rc, out, err = run_c(render, tmp, src, variables)
        check(not ok, f"{src!r}: jinja2 was expected to fail, rendered {ref[:80]!r}")
        check(rc != 0 and want in err, f"error {src[:60]!r}: want {want!r}, got rc={rc} {err.strip()!r}")
    for src, variables, want in LIMITS:
        rc, out, err = run_c(render, tmp, src, variables)
        check(rc != 0 and want in err, f"limit {src[:60]!r}: want {want!r}, got rc={rc} {err.strip()!r}")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"template engine: {len(ORACLE)} constructs against jinja2 ({n_same} identical, {n_both} failing on both), "
          f"{len(REFUSED)} refusals, {len(ERRORS)} errors, {len(LIMITS)} limits; {checks} checks, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
