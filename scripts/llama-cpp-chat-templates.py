"""Prints llama.cpp's chat template test cases (the `test_cases` table of its
tests/test-chat-template.cpp) as JSON: name, template, expected outputs (plain and Jinja), BOS
and EOS tokens, whether llama.cpp runs it with Jinja, and whether it adds messages of its own.

Usage: python3 scripts/llama-cpp-chat-templates.py "$(bash scripts/fetch-llama-cpp.sh)/tests/test-chat-template.cpp" \
    > tests/data/llama_cpp_chat_templates.json
"""
import json, re, sys
src = open(sys.argv[1], encoding="utf-8").read()
body = src[src.index("std::vector<TestCase> test_cases {"):]
body = body[:body.index("\n    };\n")]

def literal(s, i):
    """Parses adjacent C++ string literals (optionally inside U8C(...)) from s[i:]."""
    out = ""
    while True:
        while s[i] in " \t\n":
            i += 1
        if s.startswith('U8C(', i):
            text, i = literal(s, i + 4)
            while s[i] in " \t\n":
                i += 1
            assert s[i] == ")"
            out += text
            i += 1
            continue
        if s[i] != '"':
            return out, i
        i += 1
        while s[i] != '"':
            if s[i] == "\\":
                c = s[i + 1]
                out += {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}[c]
                i += 2
            else:
                out += s[i]
                i += 1
        i += 1

cases = []
for m in re.finditer(r"/\* \.name= \*/", body):
    start = m.start()
    end = body.find("/* .name= */", m.end())
    entry = body[start:end if end > 0 else len(body)]
    case = {}
    for key in ["name", "template_str", "expected_output", "expected_output_jinja", "bos_token", "eos_token"]:
        # The comment names the field, with or without a trailing `=` (both occur).
        k = re.search(r"/\* \.%s=? \*/" % key, entry)
        if k is None:
            case[key] = ""
            continue
        case[key], _ = literal(entry, k.end())
    sw = re.search(r"/\* \.supported_with_jinja= \*/\s*(true|false)", entry)
    case["supported_with_jinja"] = (sw is None) or sw.group(1) == "true"
    case["extra"] = "extra_conversation" in entry and "/* .extra_conversation= */" in entry
    cases.append(case)
print(json.dumps(cases, ensure_ascii=False, indent=1))
