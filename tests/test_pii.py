"""PII masking: each kind, checksum negatives, the Korean resident-registration number, bad input."""
import pytest

from lexgraph.extract.pii import (
    PiiMaskingError,
    iban_valid,
    luhn_valid,
    mask_pii,
)
from lexgraph.settings import Settings, SettingsError


def masked(text: str) -> str:
    return mask_pii(text).text


@pytest.mark.parametrize("email", ["jane.doe@example.com", "a_b+tag@mail.example.co.uk", "X.Y-Z@sub.domain.org"])
def test_emails(email):
    result = mask_pii(f"Write to {email}, today.")
    assert result.text == "Write to [EMAIL], today."
    assert result.counts_by_kind == {"EMAIL": 1} and result.total == 1


@pytest.mark.parametrize("phone", [
    "+44 20 7946 0958", "+1 (415) 555-0132", "+82-10-1234-5678", "+49 30 12345678", "+33 1 23 45 67 89",
    "0044 20 7946 0958", "010-1234-5678", "02-312-3456", "020 7946 0958", "(030) 1234567", "0171 1234567",
    "(415) 555-0132", "415-555-0132", "415.555.0132",
])
def test_phone_numbers(phone):
    assert masked(f"Call {phone} now.") == "Call [PHONE] now."


@pytest.mark.parametrize("text", [
    "Delivery is due on 2024-05-01 and 12.03.2024.", "The award was EUR 2 million in 2019.",
    "Invoice 4711 of 23 units", "Section 3.2.1 applies", "version 10.4.2", "ISBN 978-3-16-148410-0 ok",
])
def test_ordinary_numbers_are_left_alone(text):
    assert mask_pii(text) .text == text


@pytest.mark.parametrize("rrn", ["900101-1234567", "021231-4123456", "751120-2345678"])
def test_korean_resident_registration_numbers(rrn):
    result = mask_pii(f"주민등록번호 {rrn} 입니다")
    assert result.text == "주민등록번호 [NATIONAL_ID] 입니다"
    assert result.counts_by_kind == {"NATIONAL_ID": 1}


@pytest.mark.parametrize("text", ["901301-1234567", "900132-1234567", "900101-123456", "9001011-234567"])
def test_not_a_resident_registration_number(text):
    assert "[NATIONAL_ID]" not in masked(text)


@pytest.mark.parametrize("national_id", ["123-45-6789", "AB 12 34 56 C", "JG103752A"])
def test_other_national_ids(national_id):
    assert masked(f"id {national_id}.") == "id [NATIONAL_ID]."


def test_invalid_ssn_areas_are_not_ids():
    assert "[NATIONAL_ID]" not in masked("000-12-3456 and 666-12-3456")


@pytest.mark.parametrize("iban", ["GB82 WEST 1234 5698 7654 32", "GB82WEST12345698765432", "DE89370400440532013000",
                                  "DE89 3704 0044 0532 0130 00", "FR14 2004 1010 0505 0001 3M02 606",
                                  "NL91ABNA0417164300"])
def test_ibans(iban):
    assert iban_valid(iban)
    result = mask_pii(f"Pay to {iban} please.")
    assert result.text == "Pay to [IBAN] please." and result.counts_by_kind == {"IBAN": 1}


@pytest.mark.parametrize("iban", ["GB82 WEST 1234 5698 7654 33", "DE89370400440532013001", "GB82WEST1234569876543"])
def test_ibans_failing_mod_97_or_length_are_not_masked(iban):
    assert not iban_valid(iban)
    assert masked(f"Pay to {iban} please.") == f"Pay to {iban} please."


def test_an_iban_followed_by_a_capitalised_word():
    assert masked("IBAN GB82 WEST 1234 5698 7654 32 AND more") == "IBAN [IBAN] AND more"


@pytest.mark.parametrize("card", ["4111 1111 1111 1111", "4111-1111-1111-1111", "4111111111111111",
                                  "5500 0000 0000 0004", "3782 822463 10005", "6011 0009 9013 9424",
                                  "4222222222222"])
def test_card_numbers(card):
    assert luhn_valid(card.replace(" ", "").replace("-", ""))
    result = mask_pii(f"card {card}.")
    assert result.text == "card [CARD]." and result.counts_by_kind == {"CARD": 1}


@pytest.mark.parametrize("digits", ["4111 1111 1111 1112", "4111-1111-1111-1112", "1234567890123456",
                                    "12345678901234567890123"])
def test_digit_runs_failing_luhn_are_not_masked(digits):
    assert not luhn_valid(digits.replace(" ", "").replace("-", ""))
    assert masked(f"ref {digits}.") == f"ref {digits}."


def test_everything_at_once_with_counts():
    text = ("Jane (jane@example.com, +44 20 7946 0958, 010-1234-5678) paid with 4111 1111 1111 1111 from "
            "GB82 WEST 1234 5698 7654 32; RRN 900101-1234567.")
    result = mask_pii(text)
    assert result.text == ("Jane ([EMAIL], [PHONE], [PHONE]) paid with [CARD] from [IBAN]; RRN [NATIONAL_ID].")
    assert result.counts_by_kind == {"EMAIL": 1, "IBAN": 1, "NATIONAL_ID": 1, "CARD": 1, "PHONE": 2}


def test_text_without_pii_is_unchanged():
    text = "Alpha Shipping signed contract C-1 with Bolt Engines. Søren Åberg chairs the board."
    result = mask_pii(text)
    assert result.text == text and result.counts_by_kind == {} and result.total == 0


@pytest.mark.parametrize("value", [None, b"bytes@example.com", 42, ["a@b.com"]])
def test_non_text_input_raises(value):
    with pytest.raises(PiiMaskingError, match="expected text"):
        mask_pii(value)


def test_unpaired_surrogates_raise():
    with pytest.raises(PiiMaskingError, match="surrogate"):
        mask_pii("name \ud800 x@example.com")


def test_masking_setting_is_off_by_default():
    """LEXGRAPH_PII_MASKING, read by the one Settings: on/off, also true/false, 1/0, yes/no."""
    def enabled(environ):
        return Settings.from_env(environ).pii_masking_enabled

    assert enabled({}) is False
    assert enabled({"LEXGRAPH_PII_MASKING": "on"}) is True and enabled({"LEXGRAPH_PII_MASKING": "Yes"}) is True
    assert enabled({"LEXGRAPH_PII_MASKING": "OFF"}) is False and enabled({"LEXGRAPH_PII_MASKING": "0"}) is False
    with pytest.raises(SettingsError, match="LEXGRAPH_PII_MASKING"):
        enabled({"LEXGRAPH_PII_MASKING": "maybe"})
