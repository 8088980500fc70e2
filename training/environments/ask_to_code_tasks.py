"""Task bank for the ask-to-code environment.

Each task's public statement deliberately omits one detail (an edge case, a format, a bound). The
simulated user knows `detail` and reveals it when a question touches one of `topics`. `solution` is
the reference (the teacher submits it, and the expected outputs of the hidden tests are computed
from it, so the two can never disagree); `naive` is the plausible guess made without asking, which
fails the tests that depend on the missing detail. Only `inputs` are hidden tests' arguments.

The split is by family (`HOLDOUT_FAMILIES`), so held-out prompts test transfer of the *behaviour*
(ask first), not recall of the same kind of detail.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

HOLDOUT_FAMILIES = frozenset({"parsing", "dates"})


@dataclass(frozen=True)
class Task:
    key: str
    family: str
    func_name: str
    signature: str  # what the agent must define, e.g. "format_phone(digits: str) -> str"
    statement: str  # public: omits the detail
    detail: str  # hidden: what the user says when asked a relevant question
    topics: tuple[str, ...]  # lowercase keyword prefixes that make a question relevant
    question: str  # a relevant question (the scripted teacher asks it)
    solution: str
    naive: str
    inputs: tuple[tuple[Any, ...], ...]

    @cached_property
    def tests(self) -> list[tuple[tuple[Any, ...], Any]]:
        """(args, expected) pairs; expected values come from running the trusted reference here."""
        namespace: dict[str, Any] = {}
        exec(compile(self.solution, f"<solution {self.key}>", "exec"), namespace)  # trusted, ours
        fn = namespace[self.func_name]
        return [(args, fn(*args)) for args in self.inputs]


def _t(
    key: str,
    family: str,
    signature: str,
    statement: str,
    detail: str,
    topics: str,
    question: str,
    solution: str,
    naive: str,
    inputs: list[tuple[Any, ...]],
) -> Task:
    return Task(
        key=key,
        family=family,
        func_name=signature.split("(", 1)[0],
        signature=signature,
        statement=statement,
        detail=detail,
        topics=tuple(t.strip() for t in topics.split(",") if t.strip()),
        question=question,
        solution=solution.strip() + "\n",
        naive=naive.strip() + "\n",
        inputs=tuple(inputs),
    )


TASKS: list[Task] = [
    # ----------------------------------------------------------------------------- string_format
    _t(
        "format_phone",
        "string_format",
        "format_phone(digits: str) -> str",
        "Format a 10-digit US phone number given as a string of digits.",
        "Use the form (555) 123-4567: parentheses around the area code, a space, then a dash.",
        "parenthes, dash, hyphen, separator, look like, style, area code, output format, format",
        "What should the formatted number look like exactly?",
        """
def format_phone(digits):
    return f"({digits[:3]}) {digits[3:6]}-{digits[6:]}"
""",
        """
def format_phone(digits):
    return f"{digits[:3]}-{digits[3:6]}-{digits[6:]}"
""",
        [("5551234567",), ("2125550000",), ("8005551212",), ("4155550199",)],
    ),
    _t(
        "title_case",
        "string_format",
        "title_case(title: str) -> str",
        "Convert a book title to title case.",
        "Small words (a, an, the, of, and, or, in, on, to) stay lowercase unless they are the "
        "first word.",
        "small word, short word, article, preposition, conjunction, lowercase, every word, "
        "exception",
        "Should every word be capitalised, or do small words like 'of' stay lowercase?",
        """
SMALL = {"a", "an", "the", "of", "and", "or", "in", "on", "to"}
def title_case(title):
    words = title.lower().split()
    return " ".join(w if i and w in SMALL else w.capitalize() for i, w in enumerate(words))
""",
        """
def title_case(title):
    return " ".join(w.capitalize() for w in title.lower().split())
""",
        [
            ("the lord of the rings",),
            ("war and peace",),
            ("great expectations",),
            ("a tale of two cities",),
            ("moby dick",),
        ],
    ),
    _t(
        "format_money",
        "string_format",
        "format_money(cents: int) -> str",
        "Format an amount of money given in integer cents as a dollar string.",
        "Always two decimals with a thousands separator, and negative amounts put the minus before "
        "the dollar sign: -$1,234.50.",
        "thousand, comma, separator, negative, minus, decimal, large amount, big amount",
        "How should large and negative amounts be written - commas, minus sign placement?",
        """
def format_money(cents):
    sign = "-" if cents < 0 else ""
    return f"{sign}${abs(cents) / 100:,.2f}"
""",
        """
def format_money(cents):
    return f"${cents / 100:.2f}"
""",
        [(123450,), (5,), (-99,), (100000000,), (0,), (-123456,)],
    ),
    _t(
        "truncate",
        "string_format",
        "truncate(text: str, limit: int) -> str",
        "Shorten a text to at most `limit` characters for a preview.",
        "If you cut, end with '...' and keep the total length including the dots within the limit; "
        "text that already fits is returned unchanged.",
        "ellipsis, dots, ..., cut, indicator, suffix, marker, shortened, mark",
        "Should a cut text end with an ellipsis, and does it count toward the limit?",
        """
def truncate(text, limit):
    if len(text) <= limit:
        return text
    return text[: max(limit - 3, 0)] + "..."
""",
        """
def truncate(text, limit):
    return text[:limit]
""",
        [("hello world", 20), ("hello world", 8), ("abcdef", 6), ("abcdefgh", 5), ("", 3)],
    ),
    _t(
        "slugify",
        "string_format",
        "slugify(title: str) -> str",
        "Turn an article title into a URL slug.",
        "Lowercase; every run of characters that are not letters or digits becomes a single "
        "hyphen; no leading or trailing hyphens.",
        "punctuation, special char, symbol, non-alphanumeric, leading, trailing, character, "
        "allowed",
        "What happens to punctuation and special characters in the title?",
        """
import re
def slugify(title):
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
""",
        """
def slugify(title):
    return title.lower().replace(" ", "-")
""",
        [
            ("Hello World",),
            ("Hello, World!",),
            ("  Python 3.12: what's new?  ",),
            ("simple",),
            ("a--b",),
        ],
    ),
    _t(
        "order_id",
        "string_format",
        "order_id(n: int, width: int) -> str",
        "Render an order number as a fixed-width order id.",
        "Pad with zeros on the left to `width` digits and prefix 'ORD-'; longer numbers are not "
        "cut.",
        "prefix, pad, zero, longer, wider, overflow, look like, output format",
        "Is there a prefix, and how should the number be padded?",
        """
def order_id(n, width):
    return "ORD-" + str(n).zfill(width)
""",
        """
def order_id(n, width):
    return str(n).zfill(width)
""",
        [(42, 6), (123456, 6), (1234567, 6), (7, 3)],
    ),
    _t(
        "initials",
        "string_format",
        "initials(name: str) -> str",
        "Return the initials of a person's full name.",
        "Uppercase letters each followed by a dot, no spaces (J.R.R.T.); hyphenated parts count as "
        "separate names (Jean-Luc Picard -> J.L.P.).",
        "dot, period, hyphen, output format, punctuation, separator, look like",
        "Should the initials have dots, and how do hyphenated names count?",
        """
import re
def initials(name):
    return "".join(p[0].upper() + "." for p in re.split(r"[\\s-]+", name) if p)
""",
        """
def initials(name):
    return "".join(w[0].upper() for w in name.split())
""",
        [("ada lovelace",), ("Jean-Luc Picard",), ("j r r tolkien",), ("Plato",)],
    ),
    _t(
        "join_names",
        "string_format",
        "join_names(names: list[str]) -> str",
        "Join a list of names into an English phrase like 'Ann, Bob, and Cy'.",
        "Use the Oxford comma for three or more ('a, b, and c'); two names are 'a and b'; one name "
        "is itself; an empty list gives ''.",
        "oxford, two names, empty, single, one name, comma, fewer",
        "What about lists with two names, one name, or none?",
        """
def join_names(names):
    if len(names) <= 1:
        return "".join(names)
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return ", ".join(names[:-1]) + ", and " + names[-1]
""",
        """
def join_names(names):
    return ", ".join(names[:-1]) + ", and " + names[-1]
""",
        [(["Ann", "Bob", "Cy"],), (["Ann", "Bob"],), (["Ann"],), ([],), (["a", "b", "c", "d"],)],
    ),
    # ----------------------------------------------------------------------------- list_processing
    _t(
        "dedupe",
        "list_processing",
        "dedupe(items: list) -> list",
        "Remove duplicates from a list.",
        "Keep the first occurrence of each item and preserve the original order.",
        "order, first, keep, preserve, sort, occurrence",
        "Should the original order be preserved?",
        """
def dedupe(items):
    return list(dict.fromkeys(items))
""",
        """
def dedupe(items):
    return sorted(set(items))
""",
        [([1, 2, 2, 3],), ([3, 1, 3, 2, 1],), ([],), (["b", "a", "b"],)],
    ),
    _t(
        "chunk",
        "list_processing",
        "chunk(items: list, size: int) -> list[list]",
        "Split a list into consecutive chunks of `size` items.",
        "The last chunk may be shorter: keep it, don't drop it.",
        "last, leftover, remainder, shorter, incomplete, uneven, divisible, partial, remaining",
        "What should happen to leftover items when the length isn't divisible by size?",
        """
def chunk(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]
""",
        """
def chunk(items, size):
    return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
""",
        [([1, 2, 3, 4], 2), ([1, 2, 3, 4, 5], 2), ([1, 2, 3], 5), ([], 3)],
    ),
    _t(
        "top_k",
        "list_processing",
        "top_k(scores: dict[str, int], k: int) -> list[str]",
        "Return the names of the k highest scorers, best first.",
        "Break ties alphabetically by name.",
        "tie, equal, same score, alphabet, order, draw",
        "How should ties between equal scores be ordered?",
        """
def top_k(scores, k):
    return sorted(scores, key=lambda n: (-scores[n], n))[:k]
""",
        """
def top_k(scores, k):
    return sorted(scores, key=lambda n: -scores[n])[:k]
""",
        [
            ({"ann": 3, "bob": 5, "cy": 1}, 2),
            ({"zed": 5, "amy": 5, "bob": 4}, 2),
            ({"b": 1, "a": 1}, 1),
            ({"x": 9}, 3),
        ],
    ),
    _t(
        "flatten",
        "list_processing",
        "flatten(nested: list) -> list",
        "Flatten a nested list into a flat list.",
        "Nesting can be arbitrarily deep: flatten every level, not just one.",
        "deep, depth, level, recursive, how many, arbitrar",
        "How deep can the nesting go?",
        """
def flatten(nested):
    out = []
    for x in nested:
        out.extend(flatten(x) if isinstance(x, list) else [x])
    return out
""",
        """
def flatten(nested):
    return [y for x in nested for y in (x if isinstance(x, list) else [x])]
""",
        [([1, [2, 3]],), ([[1, [2, [3]]], 4],), ([],), ([[], [1]],)],
    ),
    _t(
        "rotate",
        "list_processing",
        "rotate(items: list, k: int) -> list",
        "Rotate a list to the right by k positions.",
        "k may be negative (rotate left) or larger than the length; an empty list stays empty.",
        "negative, larger, bigger, empty, wrap, modulo, exceed, greater",
        "Can k be negative or larger than the list?",
        """
def rotate(items, k):
    if not items:
        return []
    k %= len(items)
    return items[-k:] + items[:-k] if k else list(items)
""",
        """
def rotate(items, k):
    return items[-k:] + items[:-k]
""",
        [([1, 2, 3, 4], 1), ([1, 2, 3, 4], 6), ([1, 2, 3, 4], -1), ([], 2), ([1, 2], 0)],
    ),
    _t(
        "merge_intervals",
        "list_processing",
        "merge_intervals(intervals: list[list[int]]) -> list[list[int]]",
        "Merge overlapping [start, end] intervals; return them sorted by start.",
        "Intervals that merely touch, like [1, 3] and [3, 5], also merge.",
        "touch, adjacent, boundary, endpoint, share, inclusive, overlap",
        "Do intervals that only touch at an endpoint count as overlapping?",
        """
def merge_intervals(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out
""",
        """
def merge_intervals(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s < out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out
""",
        [
            ([[1, 3], [2, 4]],),
            ([[1, 3], [3, 5]],),
            ([[5, 6], [1, 2]],),
            ([[1, 2], [2, 3], [3, 4]],),
        ],
    ),
    _t(
        "second_largest",
        "list_processing",
        "second_largest(nums: list[int]) -> int | None",
        "Return the second largest number in a list.",
        "It must be strictly smaller than the largest: [5, 5, 3] gives 3; if there is none, return "
        "None.",
        "duplicate, distinct, repeated, same, equal, none, not exist, fewer, strictly, unique",
        "What if the largest value is repeated, or there is no second value?",
        """
def second_largest(nums):
    vals = sorted(set(nums))
    return vals[-2] if len(vals) >= 2 else None
""",
        """
def second_largest(nums):
    return sorted(nums)[-2]
""",
        [([1, 2, 3],), ([5, 5, 3],), ([7],), ([4, 4],), ([2, 9, 9, 1],)],
    ),
    _t(
        "word_counts",
        "list_processing",
        "word_counts(text: str) -> dict[str, int]",
        "Count how often each word occurs in a text.",
        "Case-insensitive, and punctuation is stripped from words ('Hello,' counts as 'hello').",
        "case, capital, upper, punctuation, comma, strip, normali",
        "Should counting be case-insensitive, and what about punctuation?",
        """
import re
def word_counts(text):
    out = {}
    for w in re.findall(r"[a-z0-9']+", text.lower()):
        out[w] = out.get(w, 0) + 1
    return out
""",
        """
def word_counts(text):
    out = {}
    for w in text.split():
        out[w] = out.get(w, 0) + 1
    return out
""",
        [("a b a",), ("Hello, hello world!",), ("",), ("The cat. The end",)],
    ),
    # ----------------------------------------------------------------------------- numeric_bounds
    _t(
        "to_percent",
        "numeric_bounds",
        "to_percent(ratio: float) -> int",
        "Convert a ratio (nominally 0..1) to an integer percentage.",
        "Round half up (0.125 -> 13) and clamp to 0..100 when the ratio is out of range.",
        "round, half, clamp, range, above, below, negative, greater, out of, limit",
        "How should I round, and what if the ratio is outside 0..1?",
        """
import math
def to_percent(ratio):
    return min(100, max(0, math.floor(ratio * 100 + 0.5)))
""",
        """
def to_percent(ratio):
    return round(ratio * 100)
""",
        [(0.5,), (0.125,), (1.7,), (-0.2,), (0.333,)],
    ),
    _t(
        "safe_div",
        "numeric_bounds",
        "safe_div(a: float, b: float) -> float",
        "Divide a by b.",
        "When b is 0, return 0.0 instead of raising.",
        "zero, divide by, denominator, division, error, raise, b is 0, b = 0",
        "What should happen when b is zero?",
        """
def safe_div(a, b):
    return a / b if b else 0.0
""",
        """
def safe_div(a, b):
    return a / b
""",
        [(6, 3), (1, 0), (0, 5), (-3, 0)],
    ),
    _t(
        "grade",
        "numeric_bounds",
        "grade(score: int) -> str",
        "Map a score to a letter grade: 90+ A, 80+ B, 70+ C, 60+ D, otherwise F.",
        "Scores outside 0..100 are invalid: return 'invalid'.",
        "invalid, outside, range, negative, above 100, over 100, bound, out of, valid",
        "What should happen with scores outside 0 to 100?",
        """
def grade(score):
    if not 0 <= score <= 100:
        return "invalid"
    for cut, letter in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= cut:
            return letter
    return "F"
""",
        """
def grade(score):
    for cut, letter in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= cut:
            return letter
    return "F"
""",
        [(95,), (85,), (42,), (101,), (-5,), (100,)],
    ),
    _t(
        "range_sum",
        "numeric_bounds",
        "range_sum(a: int, b: int) -> int",
        "Sum the integers from a to b.",
        "Both ends are inclusive, and if a > b sum from b to a.",
        "inclusive, exclusive, included, endpoint, bound, reverse, greater, order, ends",
        "Are both ends included, and can a be greater than b?",
        """
def range_sum(a, b):
    lo, hi = min(a, b), max(a, b)
    return sum(range(lo, hi + 1))
""",
        """
def range_sum(a, b):
    return sum(range(a, b))
""",
        [(1, 4), (3, 3), (5, 2), (-2, 2)],
    ),
    _t(
        "count_digits",
        "numeric_bounds",
        "count_digits(n: int) -> int",
        "Count the digits of an integer.",
        "Ignore the sign of negative numbers; 0 has one digit.",
        "negative, sign, minus, below zero",
        "How should negative numbers be counted?",
        """
def count_digits(n):
    return len(str(abs(n)))
""",
        """
def count_digits(n):
    return len(str(n))
""",
        [(12345,), (-12,), (0,), (-7,), (9,)],
    ),
    _t(
        "mean",
        "numeric_bounds",
        "mean(nums: list[float]) -> float",
        "Return the arithmetic mean of a list of numbers.",
        "An empty list returns 0.0.",
        "empty, no element, zero length, nothing, no numbers, no values",
        "What should an empty list return?",
        """
def mean(nums):
    return sum(nums) / len(nums) if nums else 0.0
""",
        """
def mean(nums):
    return sum(nums) / len(nums)
""",
        [([1, 2, 3],), ([],), ([2.5],), ([-1, 1],)],
    ),
    _t(
        "page_count",
        "numeric_bounds",
        "page_count(total_items: int, page_size: int) -> int",
        "Return how many pages are needed to show all items.",
        "Zero items still means one (empty) page.",
        "zero, empty, no items, minimum, at least, none",
        "How many pages should zero items give?",
        """
def page_count(total_items, page_size):
    return max(1, -(-total_items // page_size))
""",
        """
def page_count(total_items, page_size):
    return -(-total_items // page_size)
""",
        [(10, 3), (0, 5), (9, 3), (1, 10)],
    ),
    _t(
        "to_fahrenheit",
        "numeric_bounds",
        "to_fahrenheit(celsius: float) -> float",
        "Convert a Celsius temperature to Fahrenheit.",
        "Return it rounded to one decimal place.",
        "round, decimal, precision, digits, places, exact",
        "How precise should the result be - should I round it?",
        """
def to_fahrenheit(celsius):
    return round(celsius * 9 / 5 + 32, 1)
""",
        """
def to_fahrenheit(celsius):
    return celsius * 9 / 5 + 32
""",
        [(0,), (100,), (21.3,), (-40,), (36.6,)],
    ),
    # ----------------------------------------------------------------------------- validation
    _t(
        "valid_username",
        "validation",
        "valid_username(name: str) -> bool",
        "Check whether a username is acceptable.",
        "3 to 16 characters, letters, digits and underscores only, and it must start with a "
        "letter.",
        "length, long, short, character, allowed, underscore, start, first, rule",
        "What are the rules - length limits and allowed characters?",
        """
import re
def valid_username(name):
    return re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{2,15}", name) is not None
""",
        """
def valid_username(name):
    return name.isalnum()
""",
        [("alice",), ("al",), ("bob_99",), ("9lives",), ("a" * 17,), ("ok_name",)],
    ),
    _t(
        "strong_password",
        "validation",
        "strong_password(password: str) -> bool",
        "Check whether a password is strong enough.",
        "At least 8 characters with at least one digit and one uppercase letter.",
        "length, digit, number, uppercase, capital, requirement, rule, strong, criteri",
        "What are the exact requirements for a strong password?",
        """
def strong_password(password):
    return (len(password) >= 8 and any(c.isdigit() for c in password)
            and any(c.isupper() for c in password))
""",
        """
def strong_password(password):
    return len(password) >= 8
""",
        [("Passw0rd",), ("password",), ("Sh0rt",), ("ALLCAPS123",), ("nocaps123",)],
    ),
    _t(
        "is_palindrome",
        "validation",
        "is_palindrome(phrase: str) -> bool",
        "Check whether a phrase is a palindrome.",
        "Ignore case, spaces and punctuation.",
        "case, space, punctuation, ignore, capital, letters only, whitespace",
        "Should case, spaces and punctuation be ignored?",
        """
def is_palindrome(phrase):
    s = [c.lower() for c in phrase if c.isalnum()]
    return s == s[::-1]
""",
        """
def is_palindrome(phrase):
    return phrase == phrase[::-1]
""",
        [
            ("racecar",),
            ("A man, a plan, a canal: Panama",),
            ("hello",),
            ("Was it a car or a cat I saw",),
        ],
    ),
    _t(
        "valid_hex_color",
        "validation",
        "valid_hex_color(color: str) -> bool",
        "Check whether a string is a valid CSS hex colour like '#1a2b3c'.",
        "'#' followed by exactly 3 or 6 hex digits, case-insensitive.",
        "short, three, 3 digit, length, shorthand, case, upper",
        "Is the 3-digit shorthand allowed, and is it case-insensitive?",
        """
import re
def valid_hex_color(color):
    return re.fullmatch(r"#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})", color) is not None
""",
        """
def valid_hex_color(color):
    return len(color) == 7 and color[0] == "#" and all(c in "0123456789abcdef" for c in color[1:])
""",
        [("#1a2b3c",), ("#FFF",), ("#ABCDEF",), ("123456",), ("#12345",)],
    ),
    _t(
        "valid_email",
        "validation",
        "valid_email(address: str) -> bool",
        "Roughly validate an email address.",
        "Exactly one '@', a non-empty part before it, and a domain containing a dot that is "
        "neither its first nor its last character.",
        "domain, dot, local part, rule, strict, how strict, requirement",
        "How strict should the check be - what does the domain need?",
        """
def valid_email(address):
    if address.count("@") != 1:
        return False
    local, domain = address.split("@")
    return bool(local) and "." in domain[1:-1]
""",
        """
def valid_email(address):
    return "@" in address
""",
        [("a@b.com",), ("a@bcom",), ("@b.com",), ("a@@b.com",), ("a@.com",), ("x.y@mail.co.uk",)],
    ),
    _t(
        "valid_isbn10",
        "validation",
        "valid_isbn10(isbn: str) -> bool",
        "Check an ISBN-10 (10 characters, checksum: sum of (10 - i) * digit_i divisible by 11).",
        "The last character may be 'X', meaning 10; no other letters are allowed.",
        "x, letter, last character, check digit, character, allowed",
        "Can the last character be a letter like X?",
        """
def valid_isbn10(isbn):
    if len(isbn) != 10 or not isbn[:9].isdigit() or not (isbn[9].isdigit() or isbn[9] == "X"):
        return False
    vals = [int(c) for c in isbn[:9]] + [10 if isbn[9] == "X" else int(isbn[9])]
    return sum((10 - i) * v for i, v in enumerate(vals)) % 11 == 0
""",
        """
def valid_isbn10(isbn):
    if len(isbn) != 10 or not isbn.isdigit():
        return False
    return sum((10 - i) * int(c) for i, c in enumerate(isbn)) % 11 == 0
""",
        [("0306406152",), ("080442957X",), ("0306406153",), ("12345",)],
    ),
    _t(
        "is_anagram",
        "validation",
        "is_anagram(a: str, b: str) -> bool",
        "Check whether two phrases are anagrams of each other.",
        "Compare case-insensitively and ignore spaces.",
        "case, space, capital, ignore, whitespace, upper",
        "Should case and spaces matter?",
        """
def is_anagram(a, b):
    norm = lambda s: sorted(s.replace(" ", "").lower())
    return norm(a) == norm(b)
""",
        """
def is_anagram(a, b):
    return sorted(a) == sorted(b)
""",
        [
            ("listen", "silent"),
            ("Dormitory", "dirty room"),
            ("abc", "abd"),
            ("Astronomer", "Moon starer"),
        ],
    ),
    # --------------------------------------------------------------------------- parsing (held out)
    _t(
        "parse_kv",
        "parsing",
        "parse_kv(text: str) -> dict[str, str]",
        "Parse 'key=value' pairs from a config string into a dict.",
        "Pairs are separated by semicolons, and whitespace around keys and values is stripped.",
        "separat, delimit, semicolon, comma, whitespace, space, split",
        "What separates the pairs, and should whitespace be stripped?",
        """
def parse_kv(text):
    out = {}
    for part in text.split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out
""",
        """
def parse_kv(text):
    return dict(p.split("=", 1) for p in text.split(",") if "=" in p)
""",
        [("a=1;b=2",), (" host = x ; port=80 ",), ("k=v",), ("",)],
    ),
    _t(
        "parse_duration",
        "parsing",
        "parse_duration(text: str) -> int",
        "Parse a duration like '1h30m' into a number of seconds.",
        "Units are h, m and s, any may be missing, and a bare number means minutes.",
        "bare, no unit, plain number, without unit, unit, missing",
        "What does a bare number without a unit mean?",
        """
import re
def parse_duration(text):
    if text.strip().isdigit():
        return int(text) * 60
    mult = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * mult[u] for n, u in re.findall(r"(\\d+)([hms])", text))
""",
        """
import re
def parse_duration(text):
    if text.strip().isdigit():
        return int(text)
    mult = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * mult[u] for n, u in re.findall(r"(\\d+)([hms])", text))
""",
        [("1h30m",), ("45s",), ("90",), ("2h",), ("5",)],
    ),
    _t(
        "parse_bool",
        "parsing",
        "parse_bool(text: str) -> bool | None",
        "Parse a yes/no answer typed by a user.",
        "Accept yes/y/true/1 and no/n/false/0, case-insensitive and ignoring surrounding spaces; "
        "anything else returns None.",
        "accept, variant, case, true, other value, invalid, unrecogni, spaces, which values, "
        "anything else",
        "Which spellings should be accepted, and what about anything else?",
        """
def parse_bool(text):
    t = text.strip().lower()
    if t in ("yes", "y", "true", "1"):
        return True
    if t in ("no", "n", "false", "0"):
        return False
    return None
""",
        """
def parse_bool(text):
    return text == "yes"
""",
        [("yes",), ("No",), (" TRUE ",), ("maybe",), ("0",), ("no",)],
    ),
    _t(
        "parse_version",
        "parsing",
        "parse_version(text: str) -> list[int]",
        "Parse a version string like '1.2.3' into a list of ints.",
        "Missing parts count as 0, so there are always three numbers ('2' -> [2, 0, 0]), and a "
        "leading 'v' is allowed.",
        "missing, short, fewer, prefix, leading, always three, how many parts, parts",
        "What if some parts are missing or there's a prefix like 'v'?",
        """
def parse_version(text):
    parts = [int(p) for p in text.lstrip("v").split(".")]
    return (parts + [0, 0, 0])[:3]
""",
        """
def parse_version(text):
    return [int(p) for p in text.split(".")]
""",
        [("1.2.3",), ("2",), ("v1.4",), ("10.0.1",)],
    ),
    _t(
        "parse_csv_line",
        "parsing",
        "parse_csv_line(line: str) -> list[str]",
        "Split one CSV line into its fields.",
        "Fields may be wrapped in double quotes, and commas inside quotes do not split.",
        "quote, comma inside, escape, embedded, contain a comma",
        "Can fields be quoted and contain commas?",
        """
import csv
def parse_csv_line(line):
    return next(csv.reader([line]))
""",
        """
def parse_csv_line(line):
    return line.split(",")
""",
        [("a,b,c",), ('"x, y",z',), ('1,"two",3',), ("solo",)],
    ),
    _t(
        "parse_size",
        "parsing",
        "parse_size(text: str) -> int",
        "Parse a size like '10KB' into a number of bytes.",
        "Units are binary (KB = 1024, MB = 1024**2, GB = 1024**3), no unit means bytes, and units "
        "are case-insensitive.",
        "1024, 1000, binary, decimal, kilobyte, base, unit, kib, case",
        "Is a KB 1000 or 1024 bytes?",
        """
import re
def parse_size(text):
    n, unit = re.fullmatch(r"\\s*(\\d+)\\s*([a-zA-Z]*)\\s*", text).groups()
    return int(n) * {"": 1, "b": 1, "kb": 1024, "mb": 1024 ** 2, "gb": 1024 ** 3}[unit.lower()]
""",
        """
import re
def parse_size(text):
    n, unit = re.fullmatch(r"\\s*(\\d+)\\s*([a-zA-Z]*)\\s*", text).groups()
    return int(n) * {"": 1, "B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}[unit]
""",
        [("10KB",), ("512",), ("2mb",), ("1GB",), ("7B",)],
    ),
    _t(
        "parse_pages",
        "parsing",
        "parse_pages(text: str) -> list[int]",
        "Parse a page selection like '1,3,5' into a list of page numbers.",
        "Ranges like '3-5' are allowed and inclusive; the result is sorted with no duplicates.",
        "range, dash, hyphen, interval, duplicate, sort, order",
        "Can the selection contain ranges like 3-5, and should the result be sorted?",
        """
def parse_pages(text):
    pages = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            pages.update(range(int(a), int(b) + 1))
        elif part.strip():
            pages.add(int(part))
    return sorted(pages)
""",
        """
def parse_pages(text):
    return [int(p) for p in text.split(",")]
""",
        [("1,3,5",), ("3-5",), ("7,1-3,2",), ("4",)],
    ),
    # ----------------------------------------------------------------------------- dates (held out)
    _t(
        "is_leap",
        "dates",
        "is_leap(year: int) -> bool",
        "Return whether a year is a leap year.",
        "Use the full Gregorian rule: divisible by 4, except centuries, except every 400 years.",
        "century, centuries, 100, 400, gregorian, rule, exception",
        "Should I apply the century exceptions of the Gregorian rule?",
        """
def is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
""",
        """
def is_leap(year):
    return year % 4 == 0
""",
        [(2024,), (2023,), (1900,), (2000,), (2100,)],
    ),
    _t(
        "format_date",
        "dates",
        "format_date(year: int, month: int, day: int) -> str",
        "Format a date for display.",
        "Use ISO 8601: YYYY-MM-DD with zero padding.",
        "format, iso, order, slash, dash, padding, zero, style, look like",
        "Which date format should the output use?",
        """
def format_date(year, month, day):
    return f"{year:04d}-{month:02d}-{day:02d}"
""",
        """
def format_date(year, month, day):
    return f"{day}/{month}/{year}"
""",
        [(2024, 3, 7), (1999, 12, 31), (2000, 1, 1)],
    ),
    _t(
        "days_between",
        "dates",
        "days_between(a: str, b: str) -> int",
        "Return the number of days between two ISO dates (YYYY-MM-DD).",
        "The order may be reversed; always return the absolute number of days.",
        "order, negative, reverse, absolute, earlier, later, before",
        "Can the second date be earlier than the first?",
        """
from datetime import date
def days_between(a, b):
    return abs((date.fromisoformat(b) - date.fromisoformat(a)).days)
""",
        """
from datetime import date
def days_between(a, b):
    return (date.fromisoformat(b) - date.fromisoformat(a)).days
""",
        [("2024-01-01", "2024-01-31"), ("2024-03-01", "2024-02-01"), ("2023-05-05", "2023-05-05")],
    ),
    _t(
        "to_24h",
        "dates",
        "to_24h(time12: str) -> str",
        "Convert a 12-hour time like '2:30 PM' to 24-hour 'HH:MM'.",
        "12 AM is 00:00 and 12 PM is 12:00; hours are zero-padded.",
        "midnight, noon, 12 am, 12 pm, pad, zero, edge",
        "How should 12 AM and 12 PM be handled?",
        """
def to_24h(time12):
    clock, half = time12.split()
    h, m = map(int, clock.split(":"))
    h = h % 12 + (12 if half.upper() == "PM" else 0)
    return f"{h:02d}:{m:02d}"
""",
        """
def to_24h(time12):
    clock, half = time12.split()
    h, m = map(int, clock.split(":"))
    if half.upper() == "PM":
        h += 12
    return f"{h:02d}:{m:02d}"
""",
        [("2:30 PM",), ("9:05 AM",), ("12:00 AM",), ("12:45 PM",)],
    ),
    _t(
        "weekday",
        "dates",
        "weekday(iso_date: str) -> str",
        "Return the English weekday of an ISO date (YYYY-MM-DD).",
        "Return the three-letter abbreviation, like 'Mon'.",
        "abbreviat, full name, short, three, output format, letters, spelled",
        "Should the weekday be the full name or an abbreviation?",
        """
from datetime import date
def weekday(iso_date):
    return ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][date.fromisoformat(iso_date).weekday()]
""",
        """
from datetime import date
NAMES = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
def weekday(iso_date):
    return NAMES[date.fromisoformat(iso_date).weekday()]
""",
        [("2024-01-01",), ("2024-06-15",), ("2000-02-29",)],
    ),
    _t(
        "fiscal_quarter",
        "dates",
        "fiscal_quarter(month: int) -> str",
        "Return the fiscal quarter ('Q1'..'Q4') of a month number (1-12).",
        "The fiscal year starts in April: April-June is Q1 and January-March is Q4.",
        "fiscal, start, begin, april, january, calendar, which month",
        "When does the fiscal year start?",
        """
def fiscal_quarter(month):
    return f"Q{(month - 4) % 12 // 3 + 1}"
""",
        """
def fiscal_quarter(month):
    return f"Q{(month - 1) // 3 + 1}"
""",
        [(4,), (1,), (12,), (7,), (3,)],
    ),
    _t(
        "clock_duration",
        "dates",
        "clock_duration(seconds: int) -> str",
        "Format a number of seconds as a clock-style duration.",
        "Use H:MM:SS with no upper limit on hours (90000 -> '25:00:00') and no leading zero on "
        "hours.",
        "hours, pad, zero, leading, over 24, day, limit, output format, look like",
        "What happens past 24 hours, and should hours be zero-padded?",
        """
def clock_duration(seconds):
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"
""",
        """
import time
def clock_duration(seconds):
    return time.strftime("%H:%M:%S", time.gmtime(seconds))
""",
        [(3725,), (90000,), (59,), (36000,)],
    ),
]

TASKS_BY_KEY: dict[str, Task] = {t.key: t for t in TASKS}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(t.family for t in TASKS))

# Questions about things no task leaves open: the user gives them a vague answer (tests check that
# none of these matches any task's topics).
IRRELEVANT_QUESTIONS: tuple[str, ...] = (
    "Should I include type hints?",
    "Do you want a docstring?",
    "Can I use only the standard library?",
    "Is speed important here?",
    "Which Python version are you on?",
)
