#!/usr/bin/env python3
"""Expected token ids of SmolLM2's chat template, from independent implementations.

Renders the model's own `tokenizer.chat_template` (read from the GGUF by llama.cpp's gguf-py)
with the real Jinja engine (jinja2, as Hugging Face transformers does), then tokenizes the
rendered text with Hugging Face `tokenizers` and with llama.cpp (llama-cpp-python,
vocab_only), requires the two to agree, and writes conversations + rendered text + ids to
tests/tokenizer/chat_expected.json. tokenizer_test.cpp (ChatTemplateIdsMatchPeers) checks
that trellis's C++ ChatML rendering + tokenizer give the same text and the same ids.

Usage: chat_template_ids.py [--gguf FILE] [--out tests/tokenizer/chat_expected.json]
Exit 0 written, 1 when the peers disagree, 77 when the model or a package is missing (1 under
TRELLIS_REQUIRE_PEERS=1).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_cpp_tokenize import hf_encoder, llama_encoder  # noqa: E402
from peers import missing, missing_modules, model_missing, model_path  # noqa: E402

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Write 2+2 in words, then   3 spaces, a tab\tand 日本語."}],
    [{"role": "user", "content": "Line one\nline two\n\n<|im_end|> inside a message"}],
]


def template(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "tokenizer",
                                                  "chat_expected.json"))
    a = ap.parse_args()
    path = a.gguf or model_path()
    if not path:
        return missing(model_missing())
    why = missing_modules("jinja2", "tokenizers", "gguf", "llama_cpp")
    if why:
        return missing(why)
    import jinja2
    hf, llama = hf_encoder(path), llama_encoder(path)
    if hf is None:
        return missing(f"the hf tokenizers peer cannot model {path}'s pre-tokenizer")
    tpl = jinja2.Environment().from_string(template(path))
    cases = []
    for conv in CONVERSATIONS:
        text = tpl.render(messages=conv, add_generation_prompt=True)
        ids_hf, ids_llama = hf(text), list(llama(text))
        if ids_hf != ids_llama:
            print(f"peers disagree on {conv!r}:\n hf    {ids_hf}\n llama {ids_llama}", file=sys.stderr)
            return 1
        cases.append({"messages": conv, "text": text, "ids": ids_hf})
    with open(a.out, "w") as f:
        json.dump({"model": os.path.basename(path),
                   "how": "jinja2 render of tokenizer.chat_template (add_generation_prompt), ids from HF tokenizers "
                          "== llama.cpp; written by scripts/reference/chat_template_ids.py",
                   "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"{len(cases)} conversations, hf == llama.cpp, written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
