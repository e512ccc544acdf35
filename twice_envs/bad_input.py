"""The malformed input every env must survive: :func:`bad_actions`, and the shapes the step-time check repeats.

:func:`twice_envs.check.check_env` steps every env with these (and they stay importable from
:mod:`twice_envs.check`); random rollouts mix in the first five.
"""

from __future__ import annotations


def bad_actions() -> list[str]:
    """Malformed turns every env must survive (over 80): each must give a clear observation.

    Empty and blank text, control characters and NUL, lone surrogates (what decoding bad
    bytes gives) and Latin-1 mojibake, emoji, right-to-left and zero-width characters,
    every protocol tag of the bundled envs malformed, numbers, JSON, HTML, SQL and shell
    text, very long single tokens and repeated openers up to 64 KiB. The first five are
    short, for random rollouts.
    """
    k64 = 1 << 16
    return [
        # short ones first: random_actions mixes these into rollouts
        "", "   ", "\x00\x01garbage\x7f", "<search>unclosed", "</answer></search><answer>",
        # blank and control characters
        "\t\n\r", "\n" * 200, "\u3000\xa0\u2007", "\x00", "a\x00b\x00c", "\x1b[31mred\x1b[0m", "\x07\x08\x0b\x0c",
        "\x85\u2028\u2029", "\r\n" * 50, "\x7f" * 100,
        # lone surrogates and Latin-1 bytes
        "\udcff", "caf\udce9", "\ud800", "\udfff\ud800", "\ud83d\ude00 two code points", "<search>\udcff</search>",
        "click[\udce9]", "<action>\udcff</action>", b"\xe9t\xe9 \xff\xfe".decode("latin-1"),
        "cafÃ© Ã¼ber â€™quoteâ€\x9d", "Ã" * 5000,
        # emoji, right-to-left, zero-width, combining
        "🙂 ünïcødé ‮ right-to-left \u200b zero-width", "👩\u200d👩\u200d👧\u200d👦" * 100, "مرحبا بالعالم שלום",
        "\u202eclick[wen yub]", "\ufeff\u200b\u200c\u200d", "e\u0301" * 2000, "ｃｌｉｃｋ［ｂｕｙ ｎｏｗ］",
        # SearchQA tags malformed
        "<search", "search>", "<search/>", "<search x='1'>q</search>", "< search >q</ search >", "<SEARCH>q</SEARCH>",
        "<search>a<answer>b</search>", "<<search>>", "<search><search>", "</search>" * 1000, "<answer>", "answer>",
        "</answer", "<answer/>", "<answer>" + "x" * 5000, "<think>only thinking</think>", "<information>fake</information>",
        # WebShop actions malformed
        "click[", "click]", "click[[", "click[]]", "click[]", "search[", "search[]", "search[ ]", "click[\n]",
        "click[back to search", "click ( buy now )", "[click]", "click[" + "x" * 5000 + "]", "search[" + "q" * 600 + "]",
        "Thought: nothing to do.", "click[buy now]]]]", "search[[[[",
        # ALFWorld commands malformed
        "<action>", "<action", "</action>", "<action></action>", "<action>   </action>", "<action>go to</action>",
        "<action>take from</action>", "<ACTION>open</ACTION>", "<action>" + "go to fridge 1 " * 500 + "</action>",
        # numbers, JSON, HTML, SQL, shell, paths, format strings
        "0", "-1", "1e309", "NaN", "inf", "0x1F", "9" * 5000,
        '{"action": "search", "query": "x"}', "[]", "null", '{"a": ' * 500,
        "<html><body><script>alert(1)</script></body></html>", "&lt;search&gt;x&lt;/search&gt;", "<![CDATA[x]]>",
        "'; DROP TABLE calls; --", '" OR ""="', "$(rm -rf /) `ls` ${HOME}", "../../../../etc/passwd", "%s%s%n{0}{__class__}",
        # very long single tokens and repeated openers
        "a" * 20000, "x" * 100_000, "supercalifragilistic" * 3000, "click[" * 10000, "search[" * 9000,
        "<search>" * 8000, "<answer>" * 8000, "<action>" * 8000, "[" * k64, "<" * k64, " " * k64,
    ]


BAD_ACTIONS: tuple[str, ...] = tuple(bad_actions())

#: Repeated-opener shapes timed at 64 KiB and 1 MiB (a parser that rescans is quadratic on them).
LINEAR_SHAPES: tuple[str, ...] = ("click[", "search[[", "<search>", "<action>")
