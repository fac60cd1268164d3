"""The Go text/template subset Ollama's chat templates use: Ollama's own templates against Go's
own outputs of them (vendored from Ollama's testdata, see ollama/SOURCES.md), Go's semantics on
tricky cases, and a clear error for what is outside the subset."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ftready.serving import modelfile
from pytest_ftready.serving.gotemplate import Struct, Template, TemplateError

OLLAMA = Path(__file__).parent / "ollama"
HELLO = {"role": "user", "content": "Hello, how are you?"}
GREAT = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
SHOW = {"role": "user", "content": "I'd like to show off how chat templating works!"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CASES = {"user": [HELLO], "user-assistant-user": [HELLO, GREAT, SHOW],
         "system-user-assistant-user": [SYSTEM, HELLO, GREAT, SHOW]}  # Ollama's template_test.go


@pytest.mark.parametrize("name", sorted(p.stem for p in OLLAMA.glob("*.gotmpl")))
@pytest.mark.parametrize("case", sorted(CASES))
def test_ollamas_own_templates_render_as_go_renders_them(name, case):
    got = modelfile.ollama_prompt(Template((OLLAMA / f"{name}.gotmpl").read_text(encoding="utf-8")), CASES[case])
    if name in ("llama2-chat", "mistral-instruct") and got.endswith(" "):
        got = got[:-1]  # as Ollama's TestTemplate does for these two
    assert got == (OLLAMA / "expected" / name / case).read_text(encoding="utf-8")


def _message(role: str, content: str) -> Struct:
    return Struct("*template.templateMessage", {"Role": role, "Content": content})


def run(text: str, **data) -> str:
    return Template(text).execute(data)


MESSAGES = [_message("system", "S"), _message("user", "U"), _message("assistant", "A"), _message("tool", "T")]


@pytest.mark.parametrize("text, data, expected", [
    # trimming: {{- eats the whitespace before, -}} the whitespace after, newlines included
    ("a  \n {{- 1 -}} \n\t b", {}, "a1b"),
    ("a {{- /* a comment */ -}} b", {}, "ab"),
    ("a {{/* kept spaces */}} b", {}, "a  b"),
    ("{{-3}}", {}, "-3"),  # "{{-" with no space after is a negative number, not a trim
    ("x {{ 3 -}}\n\n y", {}, "x 3y"),
    # nested range, $ the data, $m the outer element
    ('{{ range $i, $m := .Messages }}{{ range $.Tools }}{{ $m.Role }}{{ $i }}{{ . }};{{ end }}{{ end }}',
     {"Messages": MESSAGES[:2], "Tools": ["a", "b"]}, "system0a;system0b;user1a;user1b;"),
    # an else-if chain ends in else
    ('{{ range .Messages }}{{ if eq .Role "system" }}S{{ else if eq .Role "user" }}U{{ else if eq .Role '
     '"assistant" }}A{{ else }}?{{ end }}{{ end }}', {"Messages": MESSAGES}, "SUA?"),
    # gemma3's $last idiom
    ('{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}{{ $i }}{{ if $last }}!'
     '{{ end }}{{ end }}', {"Messages": MESSAGES}, "0123!"),
    # := declares in its block, = assigns the outer variable
    ('{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ $y := 3 }}{{ $y }}{{ end }}{{ $x }}', {}, "32"),
    ('{{ $s := "" }}{{ range .Messages }}{{ if eq .Role "system" }}{{ $s = .Content }}{{ continue }}{{ end }}'
     '{{ .Role }}:{{ $s }} {{ $s = "" }}{{ if eq .Role "assistant" }}{{ break }}{{ end }}{{ end }}',
     {"Messages": MESSAGES}, "user:S assistant: "),
    # with / else, range / else
    ("{{ with .System }}[{{ . }}]{{ else }}none{{ end }}|{{ with .Prompt }}[{{ . }}]{{ else }}none{{ end }}",
     {"System": "sys", "Prompt": ""}, "[sys]|none"),
    ("{{ range .Tools }}t{{ else }}no tools{{ end }}", {"Tools": []}, "no tools"),
    ("{{ range $k, $v := .Map }}{{ $k }}={{ $v }},{{ end }}", {"Map": {"b": 2, "a": 1}}, "a=1,b=2,"),
    # pipelines pass the value as the last argument; parenthesized calls; a field of one
    ('{{ .Messages | len }} {{ "x" | printf "%s-%s" "y" }} {{ (index .Messages 1).Role }}',
     {"Messages": MESSAGES}, "4 y-x user"),
    # and/or return the deciding operand; not; comparisons
    ('{{ eq .Missing "x" }} {{ eq .Missing nil }} {{ ne .Missing "" }}', {}, "false true true"),
    ('{{ or "" "d" }} {{ and 1 0 }} {{ and 1 2 }} {{ not .Tools }} {{ lt 1 2 }} {{ ge "b" "a" }} {{ ne 1 1 }} '
     '{{ eq .Role "a" "b" "c" }}', {"Tools": [], "Role": "c"}, "d 0 2 true true true false true"),
    # print adds a space between operands when neither is a string; printf's common verbs
    ('{{ print 1 2 "a" 3 }} {{ printf "%s=%d %q %v %t %5.2f|%-3s|" "a" 3 "x\\"y" 1.5 true 3.14159 "z" }}', {},
     '1 2a3 a=3 "x\\"y" 1.5 true  3.14|z  |'),
    # Ollama's json: Go's encoding (compact, sorted keys, <>& escaped)
    ("{{ json .X }}", {"X": {"b": "<x&y>", "a": [1, 2.5, True, None]}},
     '{"a":[1,2.5,true,null],"b":"\\u003cx\\u0026y\\u003e"}'),
    ("{{ json (index .Messages 0) }}", {"Messages": MESSAGES}, '{"Role":"system","Content":"S"}'),
    # slices and strings; a raw string; a map's missing key is the zero value (missingkey=zero)
    ('{{ slice "hello" 1 3 }} {{ len "héllo" }} {{ `a\\n` }} {{ .Missing }}', {}, "el 6 a\\n <no value>"),
])
def test_go_semantics(text, data, expected):
    assert run(text, **data) == expected


@pytest.mark.parametrize("text, says", [
    ('{{ template "tools" . }}', "line 1, column 1: {{template}} (named templates) is not supported"),
    ("ok\n  {{ html .X }}", "line 2, column 6: function 'html' is not supported"),
    ("{{ if .X }}open", "line 1, column 1: {{if}} is never closed with {{end}}"),
    ("{{ end }}", "unexpected {{end}} with no if/range/with open"),
    ("{{ 'a' }}", "character constants ('a') are not supported"),
    ("{{ break }}", "{{break}} outside a range"),
    ("{{ .X", "an action {{ ... is never closed with }}"),
    ("{{/* open", "a comment {{/* is never closed"),
    ("{{ /* not a comment */ }}", "line 1, column 4: unexpected '/' in an action"),
    ("{{ .X ; }}", "line 1, column 7: unexpected ';' in an action"),
])
def test_outside_the_subset_or_malformed_is_refused_naming_the_construct_and_where(text, says):
    with pytest.raises(TemplateError) as info:
        Template(text).execute({"X": 1})
    assert says in str(info.value)


@pytest.mark.parametrize("text, data, says", [
    ('{{ eq .Role 1 }}', {"Role": "user"}, "incompatible types for comparison (string and int)"),
    ("{{ if true }}{{ $y := 3 }}{{ end }}{{ $y }}", {}, "undefined variable $y"),
    ("{{ (index .Messages 0).Name }}", {"Messages": MESSAGES}, "can't evaluate field Name in type "
                                                                "*template.templateMessage"),
    ("{{ index .Messages 9 }}", {"Messages": MESSAGES}, "index out of range: 9"),
    ("{{ .X.Y }}", {"X": None}, "nil pointer evaluating .Y"),
    ('{{ printf "%e" 1.0 }}', {}, "printf verb %e is not supported"),
    ("{{ .Messages 1 }}", {"Messages": []}, "can't give arguments to a non-function (.Messages)"),
])
def test_what_go_refuses_when_executing_is_refused(text, data, says):
    with pytest.raises(TemplateError) as info:
        Template(text).execute(data)
    assert says in str(info.value)


@pytest.mark.parametrize("text, says", [
    ("{{ range 100000000 }}x{{ end }}", "runs past 1,000,000 steps or writes more than 4,000,000 characters"),
    ("{{ range 1000000000 }}{{ end }}", "runs past 1,000,000 steps"),
    ("{{" + "(" * 3000 + "1" + ")" * 3000 + "}}", "nests actions or parentheses deeper than can be followed"),
    ("{{ if 1 }}" * 3000 + "x" + "{{ end }}" * 3000, "nests actions or parentheses deeper than can be followed"),
])
def test_a_hostile_template_is_refused_not_left_to_hang_or_crash(text, says):
    """A Modelfile is user input: a range over a huge number or nesting past Python's stack is a
    TemplateError (the check fails naming it), never a hang, a MemoryError or a RecursionError."""
    with pytest.raises(TemplateError) as info:
        Template(text).execute({})
    assert says in str(info.value)


def test_legacy_template_runs_once_per_turn_and_the_last_is_cut_after_response():
    legacy = Template("{{ if .System }}S:{{ .System }}\n{{ end }}U:{{ .Prompt }}\nA:{{ .Response }}|\n")
    assert modelfile.ollama_prompt(legacy, [SYSTEM, HELLO, GREAT, SHOW]) == (
        f"S:{SYSTEM['content']}\nU:{HELLO['content']}\nA:{GREAT['content']}|\nU:{SHOW['content']}\nA:")
    # no .Response: Ollama appends {{ .Response }} to the template
    assert modelfile.ollama_prompt(Template("<{{ .Prompt }}>"), [HELLO, GREAT, SHOW]) == (
        f"<{HELLO['content']}>{GREAT['content']}<{SHOW['content']}>")


def test_modelfile_system_goes_first_unless_the_conversation_has_one_and_same_roles_merge():
    chatml = Template((OLLAMA / "chatml.gotmpl").read_text(encoding="utf-8"))
    got = modelfile.ollama_prompt(chatml, [HELLO, {"role": "user", "content": "More."}], system="Be brief.")
    assert got == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello, how are you?\n\nMore."
                   "<|im_end|>\n<|im_start|>assistant\n")
    assert "Be brief." not in modelfile.ollama_prompt(chatml, [SYSTEM, HELLO], system="Be brief.")
    # MESSAGE history goes before the conversation, SYSTEM before both
    assert modelfile.ollama_prompt(Template("{{ range .Messages }}{{ .Role }}:{{ .Content }};{{ end }}"), [HELLO],
                                   system="B", history=[{"role": "user", "content": "hi"}, GREAT]) == (
        f"system:B;user:hi;assistant:{GREAT['content']};user:{HELLO['content']};")


def test_a_past_assistant_turn_is_rendered_closed_for_the_end_of_turn_judgement():
    render = modelfile.ollama_engine(Template((OLLAMA / "chatml.gotmpl").read_text(encoding="utf-8")),
                                     modelfile.Modelfile(Path("Modelfile")))
    assert render([HELLO, GREAT], False).endswith(GREAT["content"] + "<|im_end|>\n<|im_start|>user\n")
    assert render([HELLO], True).endswith("<|im_start|>assistant\n")
