"""PII masking before text reaches an LLM: emails, phone numbers, national ids, IBANs and card numbers.

Off by default (``LEXGRAPH_PII_MASKING=on`` enables it, read by lexgraph.settings as ``Settings.pii_masking``). Only the text sent to the model is masked;
the stored source text is untouched. Each match becomes a typed placeholder (``[EMAIL]``,
``[PHONE]``, ``[NATIONAL_ID]``, ``[IBAN]``, ``[CARD]``), so the model still sees that something was
there. Checksummed kinds are validated: an IBAN must pass mod 97, a card number must pass Luhn, so
an ordinary long number (an order number, a reference) is left alone.

Kinds are masked in a fixed order, each on the text the previous ones left: email, IBAN, national
id, card, phone. The placeholders contain no digits or ``@``, so a later kind never matches inside
an earlier placeholder.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

KINDS = ("EMAIL", "IBAN", "NATIONAL_ID", "CARD", "PHONE")


class PiiMaskingError(ValueError):
    """The input cannot be masked safely; it must not be sent anywhere."""


@dataclass(frozen=True)
class MaskResult:
    text: str
    counts_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts_by_kind.values())


def placeholder(kind: str) -> str:
    return f"[{kind}]"


# -- checksums ---------------------------------------------------------------------------------------------

def luhn_valid(digits: str) -> bool:
    """Luhn (mod 10) check of a string of digits."""
    if not digits.isdigit():
        return False
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


# ISO 13616 lengths of the countries that issue IBANs (a wrong length is not an IBAN).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
    "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
    "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28,
    "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25,
    "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}


def iban_valid(candidate: str) -> bool:
    """ISO 13616 check: known country length (when the country is listed) and mod 97 == 1."""
    iban = re.sub(r"[\s-]", "", candidate).upper()
    if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]{11,30}", iban):
        return False
    expected = IBAN_LENGTHS.get(iban[:2])
    if expected is not None and len(iban) != expected:
        return False
    rearranged = iban[4:] + iban[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)  # A=10 … Z=35
    return int(number) % 97 == 1


# -- patterns ----------------------------------------------------------------------------------------------

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,63})@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*\.[A-Za-z]{2,24}(?![\w-])")

# Two letters, two check digits, then 11–30 alphanumerics, printed compact or in groups of four.
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]){11,30}(?![A-Za-z0-9])")

_NATIONAL_IDS = (
    # Korean resident-registration number: YYMMDD-GNNNNNN (G: 1–4 citizens, 5–8 foreigners, 9/0 born 1800s).
    re.compile(r"(?<![\d-])\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])-[0-9]\d{6}(?![\d-])"),
    # US social security number: AAA-GG-SSSS (area not 000, 666 or 9xx; group and serial not zero).
    re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])"),
    # UK national insurance number: AB 12 34 56 C.
    re.compile(r"(?<![A-Za-z0-9])(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
               r" ?\d{2} ?\d{2} ?\d{2} ?[A-D](?![A-Za-z0-9])"),
)

# 13–19 digits, optionally separated by single spaces or dashes; the Luhn check decides.
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d]|[ -]\d)")

_SEP = r"[ .\-]?"
_PHONES = (
    # International: +CC then groups, e.g. +44 20 7946 0958, +1 (415) 555-0132, +82-10-1234-5678.
    re.compile(r"(?<![\w+])\+\d{1,3}" + _SEP + r"(?:\(\d{1,4}\)" + _SEP + r")?(?:\d{1,5}" + _SEP + r"){1,5}\d{2,5}"
               r"(?![\d]|[ .-]\d)"),
    # 00-prefixed international: 0044 20 7946 0958.
    re.compile(r"(?<![\w])00[1-9]\d{0,2}" + _SEP + r"(?:\d{1,5}" + _SEP + r"){1,5}\d{2,5}(?![\d]|[ .-]\d)"),
    # National trunk prefix 0: 010-1234-5678, 02-312-3456, 020 7946 0958, (030) 1234567, 0171 1234567.
    re.compile(r"(?<![\w(])(?:\(0\d{1,4}\)|0\d{1,4})" + _SEP + r"\d{3,4}" + _SEP + r"\d{3,4}(?![\d]|[ .-]\d)"),
    # North American: (415) 555-0132, 415-555-0132, 415.555.0132.
    re.compile(r"(?<![\w(])(?:\(\d{3}\) ?|\d{3}[.\- ])\d{3}[.\- ]\d{4}(?![\d]|[ .-]\d)"),
)


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def _phone_ok(match: str) -> bool:
    return 7 <= len(_digits(match)) <= 15


def _card_ok(match: str) -> bool:
    digits = _digits(match)
    separators = set(re.sub(r"\d", "", match))
    return 13 <= len(digits) <= 19 and len(separators) <= 1 and luhn_valid(digits)


def _substitute(text: str, pattern: re.Pattern, kind: str, counts: dict[str, int],
                accept: Callable[[str], bool] | None = None) -> str:
    def replace(match: re.Match) -> str:
        value = match.group(0)
        if accept is not None and not accept(value):
            return value
        counts[kind] = counts.get(kind, 0) + 1
        return placeholder(kind)

    return pattern.sub(replace, text)


def _mask_iban(candidate: str, counts: dict[str, int]) -> str:
    """The candidate may run on into following words ("… 7654 32 AND"): mask the prefix of the country's
    IBAN length when it ends at a separator and passes mod 97; otherwise leave the candidate alone."""
    expected = IBAN_LENGTHS.get(candidate[:2])
    lengths = [expected] if expected else range(34, 14, -1)
    for length in lengths:
        seen = 0
        for end, char in enumerate(candidate, 1):
            seen += char.isalnum()
            if seen == length:
                break
        else:
            continue
        rest = candidate[end:]
        if (not rest or not rest[0].isalnum()) and iban_valid(candidate[:end]):
            counts["IBAN"] = counts.get("IBAN", 0) + 1
            return placeholder("IBAN") + rest
    return candidate


def mask_pii(text: str) -> MaskResult:
    """Mask every email, IBAN, national id, card number and phone number in ``text``.

    Raises PiiMaskingError when the input is not text that can be processed safely (not a str, or
    containing unpaired surrogates that no request could encode); the caller must then not send it.
    """
    if not isinstance(text, str):
        raise PiiMaskingError(f"expected text (str), got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PiiMaskingError(f"text is not valid Unicode at position {error.start} "
                              f"(unpaired surrogate {text[error.start]!r})") from None
    counts: dict[str, int] = {}
    masked = _substitute(text, _EMAIL, "EMAIL", counts)
    masked = _IBAN.sub(lambda match: _mask_iban(match.group(0), counts), masked)
    for pattern in _NATIONAL_IDS:
        masked = _substitute(masked, pattern, "NATIONAL_ID", counts)
    masked = _substitute(masked, _CARD, "CARD", counts, _card_ok)
    for pattern in _PHONES:
        masked = _substitute(masked, pattern, "PHONE", counts, _phone_ok)
    return MaskResult(masked, {kind: counts[kind] for kind in KINDS if kind in counts})
