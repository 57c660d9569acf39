"""Issue 22 item 8, attacked on main: credential shapes beyond the issue's list that launch
environments carry (GitHub, Slack and Google API tokens; a password or token as a key=value inside a
connection string or a URL's query), redacted by value whatever the variable is called; a real launch
environment still keeps every value (tests/test_secrets_shape.py)."""

from __future__ import annotations

import pytest

from afddiag.envvars import REDACTED, is_secret_name, redact_env, redact_report, redact_text
from test_secrets_shape import REAL

SHAPED = [
    ("AFD_GIT", "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345", "0123456789abcdefghijABCDEFGHIJ012345"),
    ("AFD_GIT2", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz"),
    ("AFD_NOTIFY", "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx"),
    ("AFD_MAPS", "AIza" + "SyA-abcdefghijklmnopqrstuvwxyz123456", "SyA-abcdefghijklmnopqrstuvwxyz123456"),
    ("AFD_DSN", "host=db user=admin password=hunter2pw dbname=afd", "hunter2pw"),
    ("AFD_WEIGHTS", "https://bucket.s3.example/w.bin?X-Amz-Signature=0a1b2c3d4e5f6071&X-Amz-Expires=60",
     "0a1b2c3d4e5f6071"),
    ("AFD_HOOK", "https://hooks.example/v1/send?token=abcdef0123456789abcdef", "abcdef0123456789abcdef"),
    ("AFD_BLOB", "https://acct.blob.example/c/w?sv=2022-11-02&sig=Zm9vYmFyYmF6cXV4%3D", "Zm9vYmFyYmF6cXV4"),
]


@pytest.mark.parametrize("name,value,secret", SHAPED, ids=[s[0] for s in SHAPED])
def test_more_credential_shapes_are_redacted_by_value(name, value, secret):
    assert not is_secret_name(name)
    env, names = redact_env({name: value, "AFD_ROLE": "expert"})
    assert env == {name: REDACTED, "AFD_ROLE": "expert"} and names == [name]
    text, kinds = redact_text(f"launch line: {name}={value} end")
    assert secret not in text and kinds and text.endswith(" end")
    assert secret not in str(redact_report({"notes": [value]}))


def test_a_secret_in_a_key_value_keeps_its_key():
    assert redact_text("user=admin password=hunter2pw dbname=afd")[0] == f"user=admin password={REDACTED} dbname=afd"


def test_the_real_launch_environment_still_keeps_every_value():
    real = dict(REAL, AFD_NOTE2="bypass=1 passes=3 token bucket at 80%", AFD_URL="http://10.64.0.1:8000/v1?model=x")
    assert redact_env(real) == (real, [])
