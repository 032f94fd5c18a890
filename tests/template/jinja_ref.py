"""The reference renderer: jinja2 set up the way transformers' chat_template_utils sets it up.

ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a {% generation %} block tag whose body is rendered; `tojson` is json.dumps
(ensure_ascii=False, indent=None, separators=None, sort_keys=False; not HTML-escaped);
`raise_exception(message)` raises TemplateError(message); `strftime_now(format)` formats the
current time, pinned here to a given Unix time in local time (tests run with TZ=UTC).

Variables as apply_chat_template passes them: messages, tools (None when absent), documents
(None), add_generation_prompt, the tokenizer's special tokens, then any extra keyword
arguments.
"""
import datetime
import json

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers uses it to track
    which output spans the assistant wrote)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_env(now_unix):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.fromtimestamp(now_unix).strftime(fmt)
    return env


def render(source, variables, now_unix=0):
    """Render source with variables (a dict). Returns (True, text) or (False, error text)."""
    try:
        t = make_env(now_unix).from_string(source)
        return True, t.render(**variables)
    except Exception as e:  # any exception: the template does not render
        return False, f"{type(e).__name__}: {e}"


def render_chat(source, special_tokens, messages, extra, add_generation_prompt, now_unix):
    """As apply_chat_template(messages, add_generation_prompt=..., **extra) renders it."""
    variables = dict(special_tokens)
    variables.update({"tools": None, "documents": None})
    variables.update(extra or {})
    variables["messages"] = messages
    variables["add_generation_prompt"] = add_generation_prompt
    return render(source, variables, now_unix)
