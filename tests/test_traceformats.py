"""Trace importers: Azure's and BurstGPT's CSV traces, any CSV by its columns, Mooncake JSONL without
hash_ids, and the stated rules that make prefix ids for sources without them."""

import json

import pytest

from mooncake_gym.cli import main
from mooncake_gym.model.traceformats import TraceFormatError, parse_format, read_columns
from mooncake_gym.model.workload import derived_block_ids, read_trace

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,1396,109\n"
         "2023-11-16 18:16:46.6805900,20000,5000\n")
BURSTGPT_V11 = ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                "5,abc,1.0,ChatGPT,600,18,618,Conversation log\n"
                "45,abc,2.0,ChatGPT,1300,230,1530,Conversation log\n"
                "46,,2.0,GPT-4,700,20,720,API log\n"
                "60,abc,2.0,ChatGPT,2100,30,2130,Conversation log\n")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_times_are_seconds_from_the_first_request(tmp_path):
    cols = read_columns(write(tmp_path, "a.csv", AZURE), "azure")
    assert cols.arrival_s == pytest.approx([0.0, 4.314579, 60.0], abs=1e-6)
    assert cols.input_tokens == [374, 1396, 20000] and cols.output_tokens == [44, 109, 5000]
    assert cols.session_ids is None
    tr = read_trace(tmp_path / "a.csv", format="azure")
    assert tr.prefix_ids == "none" and tr.stats()["prefix_ids"] == "none"
    assert tr.block_ids == [(0,), (1, 2, 3), tuple(range(4, 44))]  # no request shares a block
    assert tr.stats()["ideal_hit_ratio"] == 0


def test_burstgpt_sessions_share_their_previous_turns_full_blocks(tmp_path):
    tr = read_trace(write(tmp_path, "b.csv", BURSTGPT_V11), format="burstgpt")
    assert tr.prefix_ids == "session"
    assert tr.arrival_s.tolist() == [0.0, 40.0, 41.0, 55.0]
    # 600 tokens: 2 blocks, 1 full; 1,300: shares 1, then 2 new; the API log line has no session;
    # 2,100 tokens: shares the 1,300-token turn's 2 full blocks, then 3 new
    assert tr.block_ids == [(0, 1), (0, 2, 3), (4, 5), (0, 2, 6, 7, 8)]
    assert tr.session_ids.tolist() == [0, 0, -1, 0]
    none = read_trace(tmp_path / "b.csv", format="burstgpt", prefix="none")
    assert none.prefix_ids == "none" and none.block_ids[1] == (2, 3, 4)


def test_the_session_rule_by_hand():
    ids = derived_block_ids([1024, 1000, 3000, 512], [7, 7, 7, 8], "session", block_tokens=512)
    # 1,024: 2 full blocks; 1,000 shares floor(1000/512) = 1 of them; 3,000 shares that request's 1 full
    # block; another session shares nothing
    assert ids == [(0, 1), (0, 2), (0, 3, 4, 5, 6, 7), (8,)]
    assert derived_block_ids([1024, 1000], None, "session") == [(0, 1), (2, 3)]
    with pytest.raises(ValueError, match="prefix: expected one of"):
        derived_block_ids([1], None, "hash")


def test_a_csv_by_its_columns_in_milliseconds(tmp_path):
    p = write(tmp_path, "c.csv", "t_ms,prompt,completion,conv\n1000,10,1,x\n1500,600,2,x\n")
    fmt = "csv:timestamp=t_ms,input=prompt,output=completion,session=conv,unit=ms"
    tr = read_trace(p, format=fmt)
    assert tr.arrival_s.tolist() == [0.0, 0.5] and tr.prefix_ids == "session"
    assert str(parse_format(fmt)) == fmt


def test_a_mooncake_jsonl_without_hash_ids(tmp_path):
    lines = [{"timestamp": 0, "input_length": 600, "output_length": 5, "session_id": 3},
             {"timestamp": 10, "input_length": 1100, "output_length": 5, "session_id": 3}]
    p = write(tmp_path, "m.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    tr = read_trace(p)
    assert tr.prefix_ids == "session" and tr.block_ids == [(0, 1), (0, 2, 3)]
    mixed = write(tmp_path, "x.jsonl", json.dumps(lines[0]) + "\n" +
                  json.dumps({**lines[1], "hash_ids": [0, 1, 2]}) + "\n")
    with pytest.raises(TraceFormatError, match=r"x.jsonl:2: field 'hash_ids': present here but missing"):
        read_trace(mixed)


@pytest.mark.parametrize("text, fmt, match", [
    ("TIMESTAMP,Context,GeneratedTokens\n", "azure", r"a.csv:1: the azure header lacks the column\(s\) \['ContextTokens'\]"),
    (AZURE.replace("18:15:50.9951690", "18:15:40"), "azure", r"a.csv:3: column 'TIMESTAMP': goes backwards"),
    (AZURE.replace("2023-11-16 18:16:46", "2023-11-31 18:16:46"), "azure", r"a.csv:4: column 'TIMESTAMP'"),
    (AZURE.replace(",374,", ",-3,"), "azure", r"a.csv:2: column 'ContextTokens': expected an integer in \[0,"),
    (AZURE.replace(",44\n", ",4.5\n"), "azure", r"a.csv:2: column 'GeneratedTokens': expected an integer"),
    (AZURE.replace(",44\n", ",44,9\n"), "azure", r"a.csv:2: expected 3 columns as in the header, got 4"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "azure", r"a.csv: the trace has no requests"),
    ("", "azure", r"a.csv: the trace has no requests \(no header either\)"),
    ("Timestamp,Request tokens,Response tokens\nnan,1,1\n", "burstgpt", r"a.csv:2: column 'Timestamp': expected a finite"),
])
def test_bad_rows_name_file_line_and_column(tmp_path, text, fmt, match):
    with pytest.raises(TraceFormatError, match=match):
        read_columns(write(tmp_path, "a.csv", text), fmt)


def test_bytes_that_are_not_utf8(tmp_path):
    p = tmp_path / "a.csv"
    p.write_bytes(AZURE.encode() + b"\xff\xfe,1,1\n")
    with pytest.raises(TraceFormatError, match=r"a.csv:5: not valid UTF-8"):
        read_columns(p, "azure")


@pytest.mark.parametrize("text, match", [
    ("parquet", r"trace format: expected one of"), ("azure:x=1", r"azure has fixed columns"),
    ("csv:timestamp=a,input=b", r"columns: output missing"), ("csv:timestamp=a,input=b,output=c,unit=h", "unit"),
    ("csv:timestamp=a,timestamp=b,input=b,output=c", "given twice"),
])
def test_bad_formats(text, match):
    with pytest.raises(ValueError, match=match):
        parse_format(text)


def test_trace_convert_and_every_command_reading_a_trace(tmp_path, capsys):
    src = write(tmp_path, "a.csv", AZURE)
    out = tmp_path / "a.jsonl"
    assert main(["trace", "convert", str(src), "--format", "azure", "-o", str(out)]) == 0
    back = read_trace(out)
    assert back.arrival_s.tolist() == [0.0, 4.315, 60.0]  # JSONL keeps milliseconds
    assert back.block_ids == read_trace(src, format="azure").block_ids
    capsys.readouterr()
    assert main(["trace", "stats", str(src), "--trace-format", "azure", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix_ids"] == "none"
    assert main(["replay", "--trace", str(src), "--trace-format", "azure", "--policy", "kvcentric", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 3
    # a CSV read as JSONL says what to do
    assert main(["replay", "--trace", str(src)]) == 2
    assert "give its format" in capsys.readouterr().err
    assert main(["replay", "--trace-format", "azure"]) == 2
    assert "--trace-format: has no effect without a trace file" in capsys.readouterr().err
    assert main(["trace", "convert", str(src), "--format", "csv", "-o", str(out)]) == 2
    assert "--columns" in capsys.readouterr().err
