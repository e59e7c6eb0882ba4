#!/usr/bin/env python3
"""Writes strings.json: the varied strings the tokenizer is checked on against independent
implementations (unicode, whitespace runs, digits, code, emoji, contractions, special
tokens, invalid-looking text). Deterministic: fixed seed. Run from this folder."""
import json
import random

BASE = [
    "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading",
    "tabs\tand\ttabs", "line\nbreak", "crlf\r\nline", "\n\n\nthree newlines", "   \n  mixed \t\n",
    "", " ", "  ", "\n", "\t", "a", "I'm sure you'll see they've done it, haven't they'd?",
    "DON'T SHOUT'S", "it's 'quoted' ''", "3.14159", "1234567890", "year 2024 and 1999",
    "x=10, y=-20.5e-3", "Version v1.2.3-rc4", "phone: +1 (555) 123-4567", "１２３ full-width digits",
    "٣٤٥ arabic-indic digits", "Ⅻ roman numeral", "½ ¼ ² ³ fractions",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "#include <stdio.h>\nint main(){printf(\"hi\\n\");}", "SELECT * FROM t WHERE id = 42;",
    "<div class=\"a\">text</div>", "{\"key\": [1, 2, {\"n\": null}]}", "https://example.com/path?q=1&r=2#frag",
    "user@example.org", "snake_case_name camelCaseName PascalCase kebab-case", "$HOME/.cache/trellis",
    "café naïve résumé façade", "Größe Straße Übermaß", "Ελληνικά κείμενο", "Русский текст, да.",
    "中文文本测试，标点。", "日本語のテキストです。", "한국어 텍스트", "עברית", "العربية نص",
    "हिन्दी पाठ", "ไทย ภาษา", "Tiếng Việt có dấu", "emoji 😀😃😄 and 👍🏽 and 👨‍👩‍👧‍👦",
    "flags 🇫🇷🇯🇵", "math ∑∫√∞ ≤ ≥ ≠", "arrows → ← ↔ ⇒", "box ┌─┐│└┘", "zero\u200bwidth\u200djoiner",
    "nbsp\u00a0here", "em\u2003space", "ideographic\u3000space", "combining e\u0301 a\u0308",
    "!!!???...", "---===+++", "((([[[{{{", "a.b.c.d", "...and so on…", "“smart quotes” ‘single’",
    "<|im_start|>user\nHi<|im_end|>", "<|endoftext|>", "text<|im_end|>more", "<|im_start|><|im_end|>",
    "<repo_name>trellis<file_sep>main.cpp", "<|im_start", "im_end|>", "< |im_start| >",
    "The quick brown fox jumps over the lazy dog.", "A  B   C    D", "tail spaces    ",
    "MixedCASE and ALLCAPS and lowercase", "Tokenization is the process of splitting text.",
    "   indented\n\tcode\n        more", "a\u2028b\u2029c", "\u0085next line", "x\u000by\u000cz",
    # Bytes some byte-level vocabularies have no symbol for (SmolLM2: 0x04, 0x06, 0x13, 0x14,
    # 0x16, 0x1D and the lead byte 0xF1 of U+40000): the tokenizers drop them.
    "a\u0004b", "ctrl \u0006\u0013\u0014\u0016\u001d end", "plane 4 \U00040000 char",
]

WORDS = ["the", "model", "rank", "pipeline", "tensor", "2", "42", "3.5", "don't", "we're", "émigré",
         "日本", "🙂", "\n", "  ", "\t", "<|im_end|>", "()", "=>", "::", "x_y", "A1B2", "ß", "İstanbul",
         "ǅ", "ﬁ", "Ⓐ", "𝔘𝔫𝔦", "₂", "٣"]


def main():
    rng = random.Random(1234)
    out = list(BASE)
    while len(out) < 360:
        n = rng.randint(1, 9)
        parts = [rng.choice(WORDS) for _ in range(n)]
        seps = [rng.choice(["", " ", " ", "  ", "\n", ", ", "'s "]) for _ in range(n)]
        out.append("".join(p + s for p, s in zip(parts, seps)))
    with open("strings.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
