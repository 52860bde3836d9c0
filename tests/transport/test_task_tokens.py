"""Task tokens: the tokens kept after dispatch check answers as computing them would."""

from __future__ import annotations

import base64
import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from interlock.transport.tokens import TOKENS_KEPT, TaskTokens

KEY = b"0123456789abcdef0123456789abcdef"


def _computed(capability: str, run_id: str, action_id: str, attempt: int) -> str:
    message = f"{capability}\n{run_id}\n{action_id}\n{attempt}".encode()
    digest = hmac.new(KEY, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


_TEXT = st.text(max_size=6)


@given(_TEXT, _TEXT, _TEXT, st.integers(1, 5), st.booleans())
def test_a_token_verifies_exactly_its_attempt_whether_kept_or_not(
    capability: str, run_id: str, action_id: str, attempt: int, made_here: bool
) -> None:
    tokens = TaskTokens(KEY)
    if made_here:  # kept since dispatch; otherwise computed when the answer comes
        assert tokens.token(capability, run_id, action_id, attempt) == _computed(
            capability, run_id, action_id, attempt
        )
    good = _computed(capability, run_id, action_id, attempt)
    assert tokens.verify(good, capability, run_id, action_id, attempt)
    assert not tokens.verify(good, capability, run_id, action_id, attempt + 1)
    assert not tokens.verify(good, capability + "x", run_id, action_id, attempt)
    assert not tokens.verify(
        good[:-1] + ("A" if good[-1] != "A" else "B"), capability, run_id, action_id, attempt
    )


def test_tokens_made_long_ago_still_verify() -> None:
    tokens = TaskTokens(KEY)
    first = tokens.token("cap", "run", "run:0", 1)
    for i in range(TOKENS_KEPT + 10):
        tokens.token("cap", "run", f"run:{i + 1}", 1)
    assert len(tokens._made) == TOKENS_KEPT
    assert tokens.verify(first, "cap", "run", "run:0", 1)
    assert tokens.token("cap", "run", "run:0", 1) == first
