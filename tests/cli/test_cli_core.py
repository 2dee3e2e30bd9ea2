"""The CLI's logic without a server: flags into the order body, tables that fit the terminal, ID prefixes, the config
file, the HTTP client's errors and its one polite retry (against a stub on loopback), the ssh command line, the
de-duplication of a followed log, and every command's help."""
from __future__ import annotations

import argparse
import io
import json
import os
import stat
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpumarket import cli, config, parse
from gpumarket.client import Client, retry_after
from gpumarket.errors import (EXIT_API, EXIT_AUTH, EXIT_NOT_FOUND, EXIT_UNREACHABLE, EXIT_USAGE, ApiError, AuthError,
                              NotFound, Unreachable, UsageError)
from gpumarket.leases import metric_rows, ssh_argv
from gpumarket.resolve import match, resolve
from gpumarket.table import Column, duration, relative, render, usd
from gpumarket.watch import new_output, socket_url

LEASE = "1a2b3c4d-0000-4000-8000-000000000001"


def order_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["order", *argv])


def body_of(*argv: str, **kw) -> dict:
    args = order_args(*argv)
    return parse.order_body(args, args.mode, **kw)


# --- values --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                           ("1.5h", 5400), ("1d", 86400), (" 2H ", 7200)])
def test_durations_read_as_a_person_writes_them(text, seconds):
    assert parse.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "1.5s", "2 hours", "h", "-5m", "1w"])
def test_a_duration_that_is_not_one_is_a_usage_error(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse.duration(text)


def test_times_are_iso_or_relative_and_local_without_a_zone():
    now = datetime(2026, 11, 30, 12, 0, 0, 500, tzinfo=timezone.utc)
    assert parse.when("2026-12-01T09:00Z") == datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    assert parse.when("2026-12-01T10:00+01:00") == datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    assert parse.when("+2h", now=now) == datetime(2026, 11, 30, 14, 0, tzinfo=timezone.utc)
    naive = datetime(2026, 12, 1, 9, 0)
    assert parse.when("2026-12-01T09:00") == naive.astimezone().astimezone(timezone.utc)
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        parse.when("tomorrow")


@pytest.mark.parametrize("text, port", [
    ("22", {"port": 22, "protocol": "tcp"}), ("8888/http", {"port": 8888, "protocol": "tcp", "kind": "http"}),
    ("9000/udp", {"port": 9000, "protocol": "udp"}), ("2222/SSH", {"port": 2222, "protocol": "tcp", "kind": "ssh"})])
def test_ports_take_a_protocol_or_how_to_show_them(text, port):
    assert parse.port(text) == port


@pytest.mark.parametrize("text", ["0", "65536", "http", "22/sctp", "22:http"])
def test_a_bad_port_is_a_usage_error(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse.port(text)


def test_a_secret_named_alone_comes_from_the_environment_and_a_missing_one_is_refused(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert parse.secret_pair("HF_TOKEN") == ("HF_TOKEN", "hf_from_env")
    assert parse.secret_pair("HF_TOKEN=given") == ("HF_TOKEN", "given")
    assert parse.env_pair("A=b=c") == ("A", "b=c")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(argparse.ArgumentTypeError, match=r"\$HF_TOKEN is not set"):
        parse.secret_pair("HF_TOKEN")
    for bad in ("1X=2", "A-B=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a variable name"):
            parse.env_pair(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
        parse.env_pair("NOVALUE")


@pytest.mark.parametrize("text, price", [("1.20", "1.20"), ("$0.8", "0.8"), ("0.000001", "0.000001")])
def test_prices_are_kept_as_decimal_text(text, price):
    assert parse.price(text) == price


@pytest.mark.parametrize("text", ["-1", "abc", "0.0000001", "inf", "NaN"])
def test_a_bad_price_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse.price(text)


def test_an_offer_id_becomes_its_models_region_and_slice():
    assert parse.offer("a100-80gb:3g.40gb:eu-west") == {"gpu_models": ["a100-80gb"], "regions": ["eu-west"],
                                                         "compute_slices": 3, "memory_gb": 40, "whole_gpu": False}
    assert parse.offer("l4:whole:us-east") == {"gpu_models": ["l4"], "regions": ["us-east"], "whole_gpu": True}
    assert parse.offer("a100-80gb:1g.10gb+me:eu-west")["memory_gb"] == 10
    for bad in ("a100-80gb", "a100-80gb:big:eu", "::"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse.offer(bad)


# --- the order body ------------------------------------------------------------------------------------------------

def test_an_on_demand_order_with_a_workload_is_the_apis_body(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    body = body_of("on-demand", "--offer", "a100-80gb:1g.10gb:eu-west", "--image", "docker.io/me/trainer:3",
                   "--cmd", "python train.py --epochs '3 4'", "--args=--fast", "--env", "EPOCHS=3",
                   "--secret-env", "HF_TOKEN", "--port", "22", "--port", "8888/http", "--disk", "50", "--job",
                   "--max-duration", "2h", "--max-price", "1.50", "--queue", "--project", "7", "--priority", "2")
    assert body == {
        "mode": "on_demand", "gpu_models": ["a100-80gb"], "regions": ["eu-west"], "compute_slices": 1,
        "memory_gb": 10, "whole_gpu": False, "priority": 2, "project": 7, "if_unavailable": "queue",
        "max_price_per_hour": "1.50", "duration_seconds": 7200,
        "workload": {"image": "docker.io/me/trainer:3", "command": ["python", "train.py", "--epochs", "3 4"],
                     "args": ["--fast"],
                     "env": [{"name": "EPOCHS", "value": "3"}, {"name": "HF_TOKEN", "value": "hf_secret",
                                                                 "secret": True}],
                     "ports": [{"port": 22, "protocol": "tcp"}, {"port": 8888, "protocol": "tcp", "kind": "http"}],
                     "disk_gb": 50, "kind": "job"}}


def test_flags_given_after_an_offer_override_it_and_k_gpus_are_whole():
    body = body_of("on-demand", "--offer", "h100-80gb:whole:eu-west", "--model", "h100-80gb", "--model", "h200-141gb",
                   "--region", "us-east", "--gpus", "4")
    assert body["gpu_models"] == ["h100-80gb", "h200-141gb"] and body["regions"] == ["us-east"]
    assert body["gpu_count"] == 4 and body["whole_gpu"] is True
    assert "workload" not in body and "duration_seconds" not in body


def test_a_spot_order_bids_and_a_reserved_one_books_a_window():
    spot = body_of("spot", "--model", "l4", "--bid", "0.80", "--template", "pytorch", "--notice", "file")
    assert spot["max_price_per_hour"] == "0.80"
    assert spot["workload"] == {"template": "pytorch", "notice": "file"}
    reserved = body_of("reserved", "--model", "l4", "--start", "2026-12-01T09:00Z", "--hours", "1.5")
    assert (reserved["window_start"], reserved["window_end"]) == ("2026-12-01T09:00:00Z", "2026-12-01T10:30:00Z")
    assert body_of("reserved", "--start", "2026-12-01T09:00Z", "--end", "2026-12-01T12:00Z")["window_end"] == \
        "2026-12-01T12:00:00Z"


@pytest.mark.parametrize("argv, message", [
    (["reserved", "--start", "+1h"], "needs --hours"),
    (["reserved", "--start", "+1h", "--hours", "1", "--end", "+3h"], "not both"),
    (["on-demand", "--port", "22"], "needs --image or --template"),
    (["on-demand", "--image", "x", "--env", "A=1", "--secret-env", "A=2"], "A given twice"),
])
def test_an_order_that_cannot_be_a_body_is_refused_before_the_server_sees_it(argv, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        body_of(*argv)


@pytest.mark.parametrize("argv", [["spot", "--model", "l4"], ["reserved", "--hours", "2"],
                                  ["on-demand", "--port", "99999"], ["on-demand", "--duration", "soon"],
                                  ["on-demand", "--bid", "1"], ["reserved", "--start", "+1h", "--gpus", "2"]])
def test_missing_or_malformed_flags_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        order_args(*argv)
    assert exit_.value.code == EXIT_USAGE


def test_an_api_field_in_an_error_is_shown_with_the_flag_that_sets_it():
    assert parse.field_flag("duration_seconds") == "--duration"
    assert parse.field_flag("workload.env[2].value") == "--env/--secret-env"
    assert parse.field_flag("workload.image") == "--image"
    assert parse.field_flag("webhook_urlx") is None
    assert parse.flat_fields({"workload": {"env": [{}, {"name": ["bad name"]}]}, "memory_gb": ["too big"]}) == [
        ("workload.env[1].name", "bad name"), ("memory_gb", "too big")]


# --- tables --------------------------------------------------------------------------------------------------------

COLUMNS = [Column("ID"), Column("GPU", shrink=True), Column("$/H", right=True), Column("NOTE", shrink=True, drop=1),
           Column("REGION", drop=2)]
ROWS = [["1a2b3c4d", "a100-80gb 1g.10gb", "1.26", "container running fine for a long time", "eu-west"],
        ["5e6f7a8b", "h100-80gb whole", "12.60", "", "us-east"]]


def test_a_table_without_a_terminal_keeps_every_value_whole_and_aligns_numbers_right():
    lines = render(COLUMNS, ROWS).splitlines()
    assert lines[0].split() == ["ID", "GPU", "$/H", "NOTE", "REGION"]
    assert "container running fine for a long time" in lines[1]
    assert lines[1].index("1.26") + 4 == lines[2].index("12.60") + 5  # right edges line up


@pytest.mark.parametrize("width", [100, 70, 52, 40])
def test_a_table_fits_the_terminal_by_cutting_then_dropping_columns(width):
    text = render(COLUMNS, ROWS, width)
    assert all(len(line) <= width for line in text.splitlines()), text
    header = text.splitlines()[0].split()
    assert header[:3] == ["ID", "GPU", "$/H"]  # never dropped
    if width < 44:  # cut to their least, the columns still need 44: the highest `drop` goes first
        assert "REGION" not in header and "NOTE" in header
    assert "1a2b3c4d" in text and "12.60" in text


def test_a_cut_value_ends_with_an_ellipsis_and_the_header_alone_shows_for_no_rows():
    text = render(COLUMNS, ROWS, 70)
    assert "…" in text or "~" in text
    assert render(COLUMNS, [], 70).split() == ["ID", "GPU", "$/H", "NOTE", "REGION"]


@pytest.mark.parametrize("value, shown", [("1.260000", "$1.26"), ("0.028333", "$0.028333"), ("12", "$12.00"),
                                          ("-0.500000", "-$0.50"), (None, "-"), ("0.000000", "$0.00")])
def test_money_shows_cents_and_every_micro_dollar_that_is_there(value, shown):
    assert usd(value) == shown


def test_a_price_column_rounds_to_its_places_half_up():
    assert [usd(v, places=4) for v in ("0.514286", "3.6", "0.00005", "0.000049")] == [
        "$0.5143", "$3.6000", "$0.0001", "$0.0000"]
    assert usd("1.5", per_hour=True) == "$1.50/h"


def test_durations_and_relative_times_read_short():
    assert [duration(s) for s in (9, 250, 3720, 90000)] == ["9s", "4m 10s", "1h 2m", "1d 1h"]
    now = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    assert relative((now - timedelta(minutes=5)).isoformat(), now) == "5m ago"
    assert relative((now + timedelta(hours=2)).isoformat().replace("+00:00", "Z"), now) == "in 2h"
    assert relative(None, now) == "-"


def test_metric_readings_a_gpu_cannot_give_show_as_dashes():
    rows = metric_rows({"ts": 0, "gpus": [{"uuid": "GPU-1", "util": None, "mem_used_mib": 2048, "mem_total_mib": 81920,
                                           "temp_c": 41.4, "power_w": 88.2, "sm_clock_mhz": None}]})
    assert rows[0][1:] == ["-", "2.0 GiB", "80.0 GiB", "41", "88", "-"]


# --- ID prefixes ---------------------------------------------------------------------------------------------------

IDS = [LEASE, "1a2b9999-0000-4000-8000-000000000002", "ffff0000-0000-4000-8000-000000000003"]


def test_a_unique_prefix_names_its_id_with_or_without_dashes_in_any_case():
    assert match("1A2B3C", IDS, what="lease") == LEASE
    assert match("ffff00000000", IDS, what="lease") == IDS[2]
    assert match("ffff0000-0000", IDS, what="lease") == IDS[2]


def test_a_prefix_of_several_is_a_usage_error_naming_them_and_of_none_a_not_found():
    with pytest.raises(UsageError, match="names 2 leases") as several:
        match("1a2b", IDS, what="lease")
    assert several.value.exit_code == EXIT_USAGE and "1a2b3c4d" in several.value.message
    with pytest.raises(NotFound) as none:
        match("abc", IDS, what="lease")
    assert none.value.exit_code == EXIT_NOT_FOUND
    with pytest.raises(UsageError, match="not a lease ID"):
        match("zz", IDS, what="lease")


def test_a_full_id_is_not_looked_up():
    def listing():
        raise AssertionError("a full ID needs no listing")
    assert resolve(LEASE.upper(), listing, what="lease") == LEASE


# --- the config file -----------------------------------------------------------------------------------------------

def test_login_state_is_a_file_only_its_owner_reads_and_the_environment_wins(tmp_path):
    env = {"HOME": str(tmp_path)}
    path = config.save("http://127.0.0.1:8000", "gpm_key_abc", env)
    assert path == tmp_path / ".config" / "gpumarket" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": "http://127.0.0.1:8000", "key": "gpm_key_abc"}
    assert config.settings(env) == config.Settings("http://127.0.0.1:8000", "gpm_key_abc", str(path))
    over = config.settings(env | {"GPUM_URL": "https://m.example.org/api/v1/", "GPUM_API_KEY": "gpm_key_env"})
    assert over == config.Settings("https://m.example.org", "gpm_key_env", "GPUM_API_KEY")
    xdg = config.settings({"HOME": "/nowhere", "XDG_CONFIG_HOME": str(tmp_path / ".config")})
    assert xdg.key == "gpm_key_abc"
    assert config.forget(env) == path and not path.exists() and config.forget(env) is None
    assert config.settings(env) == config.Settings(config.DEFAULT_URL, None, "")


@pytest.mark.parametrize("url", ["ftp://x", "localhost:8000", "http://", "http://h:99999"])
def test_a_url_that_is_not_a_servers_is_refused(url):
    with pytest.raises(UsageError):
        config.normalize_url(url)


# --- the HTTP client (a stub server on loopback) -------------------------------------------------------------------

class Stub(BaseHTTPRequestHandler):
    script: list = []  # (status, headers, body) answered in turn
    seen: list = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        Stub.seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length) if length else b""))
        status, headers, body = Stub.script.pop(0)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    Stub.script, Stub.seen = [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def client(url, key="gpm_key_k"):
    slept, warned = [], []
    c = Client(url, key, sleep=slept.append, warn=warned.append)
    return c, slept, warned


def test_a_busy_server_is_asked_again_once_after_its_retry_after(stub):
    Stub.script = [(503, {"Retry-After": "2"}, {"error": {"code": "service_unavailable", "message": "busy"}}),
                   (200, {}, {"ok": True})]
    c, slept, warned = client(stub)
    assert c.post("orders/", {"mode": "spot"}) == {"ok": True}
    assert slept == [2.0] and "trying again in 2 s" in warned[0]
    assert [s[1] for s in Stub.seen] == ["/api/v1/orders/"] * 2
    assert Stub.seen[1][2]["Authorization"] == "Bearer gpm_key_k" and json.loads(Stub.seen[1][3]) == {"mode": "spot"}


def test_a_second_refusal_or_one_without_retry_after_is_the_apis_error(stub):
    Stub.script = [(429, {"Retry-After": "1"}, {"error": {"code": "throttled", "message": "slow down"}})] * 2
    c, slept, _ = client(stub)
    with pytest.raises(ApiError, match="slow down") as exc:
        c.get("leases/")
    assert exc.value.status == 429 and slept == [1.0] and exc.value.exit_code == EXIT_API
    Stub.script = [(503, {}, {"error": {"code": "payments_unavailable", "message": "payments are off"}})]
    c, slept, _ = client(stub)
    with pytest.raises(ApiError, match="payments are off"):
        c.post("topups/", {})
    assert slept == []
    Stub.script = [(503, {"Retry-After": "3600"}, {"error": {"code": "service_unavailable", "message": "later"}})]
    with pytest.raises(ApiError, match="later"):
        client(stub)[0].get("x/")


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after("5") == 5.0
    assert retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=datetime(2015, 10, 21, 7, 28, 0,
                                                                      tzinfo=timezone.utc).timestamp()) == 10.0
    assert retry_after("soon") is None and retry_after(None) is None


@pytest.mark.parametrize("status, body, error, exit_code", [
    (400, {"error": {"code": "invalid", "message": "memory_gb: too big", "fields": {"memory_gb": ["too big"]}}},
     ApiError, EXIT_API),
    (401, {"error": {"code": "authentication_failed", "message": "unknown or revoked API key"}}, ApiError, EXIT_AUTH),
    (403, {"error": {"code": "permission_denied", "message": "this key lacks the trade scope"}}, ApiError, EXIT_AUTH),
    (404, {"error": {"code": "not_found", "message": "not found"}}, ApiError, EXIT_NOT_FOUND),
    (502, b"<html>Bad Gateway</html>", ApiError, EXIT_API),
])
def test_errors_keep_the_apis_message_and_map_to_exit_codes(stub, status, body, error, exit_code):
    Stub.script = [(status, {"Content-Type": "text/html"} if isinstance(body, bytes) else {}, body)]
    with pytest.raises(error) as exc:
        client(stub)[0].get("x/")
    assert exc.value.exit_code == exit_code
    if isinstance(body, dict):
        assert exc.value.message == body["error"]["message"]
        assert exc.value.fields == body["error"].get("fields", {})
    else:
        assert exc.value.message == "HTTP 502 Bad Gateway: <html>Bad Gateway</html>"


def test_no_server_or_no_key_are_their_own_errors(stub):
    with pytest.raises(Unreachable) as exc:
        Client("http://127.0.0.1:9", "k").get("x/")
    assert exc.value.exit_code == EXIT_UNREACHABLE
    with pytest.raises(AuthError, match="not logged in"):
        Client(stub, None).get("leases/")
    Stub.script = [(200, {}, {"count": 0, "results": []})]
    assert Client(stub, None).get("offers/", auth=False) == {"count": 0, "results": []}
    assert "Authorization" not in Stub.seen[0][2]


def test_pages_are_followed_by_their_query_whatever_host_next_names(stub):
    Stub.script = [(200, {}, {"count": 3, "next": "http://proxy.internal/api/v1/leases/?limit=2&offset=2&state=x",
                              "results": [{"id": 1}, {"id": 2}]}),
                   (200, {}, {"count": 3, "next": None, "results": [{"id": 3}]})]
    assert [x["id"] for x in client(stub)[0].pages("leases/", {"state": "x"})] == [1, 2, 3]
    assert Stub.seen[0][1] == "/api/v1/leases/?state=x&limit=200"
    assert Stub.seen[1][1] == "/api/v1/leases/?limit=2&offset=2&state=x"


# --- the command line ----------------------------------------------------------------------------------------------

def run_main(argv, env=None, client_=None):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, out=out, err=err, env=env or {"HOME": "/nonexistent"}, client=client_)
    return code, out.getvalue(), err.getvalue()


def test_an_api_error_prints_its_message_the_flags_and_the_reasons_on_stderr(stub):
    Stub.script = [(409, {}, {"error": {"code": "unavailable", "message": "nothing fits this order",
                                        "fields": {"duration_seconds": ["too long"]},
                                        "details": {"reasons": ["no online node", "price above cap"]}}})]
    code, out, err = run_main(["order", "on-demand", "--model", "l4", "--duration", "1h"],
                              client_=client(stub)[0])
    assert code == EXIT_API and out == ""
    assert err.splitlines() == ["gpum: nothing fits this order", "  (duration_seconds is --duration)",
                                "  - no online node", "  - price above cap"]


def test_a_refusal_with_the_markets_sentence_prints_the_sentence_not_the_engines_reason_keys(stub):
    sentence = "No whole L4 is free under your price cap of $0.5000/h: 2 fully taken."
    Stub.script = [(409, {}, {"error": {"code": "unavailable", "message": sentence,
                                        "details": {"reasons": ["GPU busy", "no legal placement"],
                                                    "explain": sentence}}})]
    code, out, err = run_main(["order", "on-demand", "--model", "l4", "--whole-gpu"], client_=client(stub)[0])
    assert code == EXIT_API and out == ""
    assert err.splitlines() == [f"gpum: {sentence}"]


def test_json_is_accepted_before_or_after_the_command(stub):
    Stub.script = [(200, {}, {"count": 1, "results": [{"id": "x"}]})] * 2
    for argv in (["--json", "orders", "--state", "queued"], ["orders", "--state", "queued", "--json"]):
        code, out, _ = run_main(argv, client_=client(stub)[0])
        assert code == 0 and json.loads(out) == [{"id": "x"}]


def test_a_command_that_needs_a_key_without_one_exits_3_and_says_how_to_log_in(tmp_path):
    code, _, err = run_main(["leases"], env={"HOME": str(tmp_path)})
    assert code == EXIT_AUTH and "not logged in" in err and "gpum login" in err


def _all_commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if not sub.prog.endswith(f" {name}"):  # an alias: the same parser under its first name
                    continue
                yield prefix + (name,), sub
                yield from _all_commands(sub, prefix + (name,))


def test_every_command_has_help_with_a_description(capsys):
    commands = list(_all_commands(cli.build_parser()))
    names = {" ".join(c) for c, _ in commands}
    for expected in ("login", "logout", "offers", "order on-demand", "order spot", "order reserved", "order show",
                     "order cancel", "orders", "leases", "lease show", "lease end", "ssh", "logs", "metrics",
                     "resale list", "resale buy", "resale sell", "balance", "statements", "topup", "templates",
                     "ssh-key add", "reservations"):
        assert expected in names
    for command, sub in commands:
        assert sub.description, f"gpum {' '.join(command)} has no description"
        with pytest.raises(SystemExit) as exit_:
            cli.build_parser().parse_args([*command, "--help"])
        assert exit_.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: gpum {' '.join(command)}")


# --- ssh and the live socket ---------------------------------------------------------------------------------------

def test_ssh_runs_the_leases_line_with_its_host_key_kept_per_lease_and_the_callers_arguments():
    argv = ssh_argv("ssh -p 20001 root@203.0.113.7", LEASE, known_hosts_file=Path("/h/.config/gpumarket/known_hosts"),
                    identity="~/.ssh/work", extra=["-L", "8888:localhost:8888", "nvidia-smi"])
    assert argv == ["ssh", "-p", "20001", "-i", os.path.expanduser("~/.ssh/work"), "-o", "IdentitiesOnly=yes",
                    "-o", f"HostKeyAlias=gpum-{LEASE}", "-o", "UserKnownHostsFile=/h/.config/gpumarket/known_hosts",
                    "-o", "StrictHostKeyChecking=accept-new", "root@203.0.113.7", "-L", "8888:localhost:8888",
                    "nvidia-smi"]
    assert ssh_argv("ssh root@h", LEASE, known_hosts_file=Path("/k"))[-1] == "root@h"


def test_ssh_passes_everything_after_the_double_dash_to_ssh():
    args = cli.parse(["ssh", "1a2b", "-i", "k", "--", "-v", "ls", "-la", "--", "x"])
    assert (args.lease, args.identity, args.extra) == ("1a2b", "k", ["-v", "ls", "-la", "--", "x"])
    assert cli.parse(["ssh", "1a2b"]).extra == []
    with pytest.raises(SystemExit) as exit_:
        cli.parse(["leases", "--", "x"])
    assert exit_.value.code == EXIT_USAGE


@pytest.mark.parametrize("tail, early, new", [
    ("a\nb\n", ["b\n", "c\n"], ["c\n"]),        # b was kept before the tail was read
    ("a\nb\n", ["c\n"], ["c\n"]),               # nothing came twice
    ("", ["a\n"], ["a\n"]),
    ("x\nb\nc\n", ["b\n", "c\n"], []),          # all of it was in the tail
    ("b\nb\n", ["b\n", "b\n", "d\n"], ["d\n"]),
])
def test_a_followed_log_prints_what_came_during_the_tails_fetch_once(tail, early, new):
    assert new_output(tail, early) == new


@pytest.mark.parametrize("base, url", [("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/console/"),
                                       ("https://m.example.org/market", "wss://m.example.org/market/ws/console/")])
def test_the_live_socket_is_the_servers_console_socket(base, url):
    assert socket_url(base) == url


# --- order --wait (the server scripted) ----------------------------------------------------------------------------

ORDER = "0dde0000-0000-4000-8000-000000000001"


def _lease(state: str, **extra) -> dict:
    return {"id": LEASE, "order": ORDER, "mode": "on_demand", "state": state, "gpu_model": "l4", "profile": "whole",
            "region": "eu-west", "price_per_hour": "3.600000", "cost": "0.000000", "cost_charged": "0.000000",
            "started_at": None, "ends_at": None, "ended_at": None, "end_reason": "", "connection": None,
            "interruption": None, "workload": None, **extra}


def test_wait_follows_a_queued_order_until_its_lease_runs_and_prints_how_to_reach_it(stub, monkeypatch):
    from gpumarket import market
    monkeypatch.setattr(market, "WAIT_POLL_SECONDS", 0)
    queued = {"id": ORDER, "mode": "on_demand", "state": "queued", "reasons": ["no free l4"], "leases": []}
    placed = dict(queued, state="placed", reasons=[], leases=[LEASE], price_per_hour="3.600000")
    running = _lease("running", connection={"ssh": "ssh -p 20000 root@203.0.113.7", "device_uuid": "GPU-1",
                                            "env": {"CUDA_VISIBLE_DEVICES": "GPU-1"}, "hostname": "n1", "urls": [],
                                            "ports": []})
    Stub.script = [(202, {}, queued), (200, {}, queued), (200, {}, placed),
                   (200, {}, _lease("provisioning", workload={"state": "pulling", "progress": "40%"})),
                   (200, {}, placed), (200, {}, running)]
    code, out, err = run_main(["order", "on-demand", "--model", "l4", "--queue", "--wait"], client_=client(stub)[0])
    assert code == 0, err
    assert err.splitlines() == [f"order {ORDER[:8]} queued: no free l4",
                                f"lease {LEASE[:8]} provisioning: container pulling 40%"]
    assert f"lease {LEASE[:8]} running: l4 whole in eu-west, $3.60/h" in out
    assert "ssh -p 20000 root@203.0.113.7    (gpum ssh 1a2b3c4d)" in out
    assert json.loads(Stub.seen[0][3])["if_unavailable"] == "queue"


def test_a_queued_order_says_why_in_the_buyers_words_not_the_engines(stub):
    sentence = "No node has 8 whole GPUs free at or under your price cap of $0.5000/h: all 17 GPUs are priced above it."
    Stub.script = [(202, {}, {"id": ORDER, "mode": "on_demand", "state": "queued", "leases": [],
                              "reasons": ["price over cap 0.5/h"], "explain": sentence})]
    code, out, err = run_main(["order", "on-demand", "--gpus", "8", "--max-price", "0.5", "--queue"],
                              client_=client(stub)[0])
    assert code == 0, err
    assert out.splitlines()[0] == f"on-demand order {ORDER[:8]} queued: {sentence}"
    # an older market without the sentence: the engine's reasons, as before
    Stub.script = [(202, {}, {"id": ORDER, "mode": "on_demand", "state": "queued", "leases": [],
                              "reasons": ["price over cap 0.5/h"]})]
    code, out, err = run_main(["order", "on-demand", "--gpus", "8", "--queue"], client_=client(stub)[0])
    assert out.splitlines()[0] == f"on-demand order {ORDER[:8]} queued: price over cap 0.5/h"


def test_wait_on_a_lease_that_fails_is_an_error_with_its_reason(stub, monkeypatch):
    from gpumarket import market
    monkeypatch.setattr(market, "WAIT_POLL_SECONDS", 0)
    placed = {"id": ORDER, "mode": "on_demand", "state": "placed", "reasons": [], "leases": [LEASE]}
    failed = _lease("failed", end_reason="the workload did not start: image not found")
    Stub.script = [(201, {}, placed), (200, {}, failed)]
    code, out, err = run_main(["order", "on-demand", "--image", "x:missing", "--wait"], client_=client(stub)[0])
    assert code == EXIT_API
    assert err.startswith(f"gpum: lease {LEASE[:8]} failed: the workload did not start: image not found\n")
    assert f"gpum logs {LEASE[:8]}" in err


def test_wait_gives_up_at_its_timeout_and_says_the_order_goes_on(stub, monkeypatch):
    from gpumarket import market
    monkeypatch.setattr(market, "WAIT_POLL_SECONDS", 0)
    queued = {"id": ORDER, "mode": "spot", "state": "queued", "reasons": ["bid under the spot price"], "leases": []}
    Stub.script = [(202, {}, queued)] + [(200, {}, queued)] * 50
    ticks = iter(range(0, 10_000, 400))
    monkeypatch.setattr(market.time, "monotonic", lambda: next(ticks))
    code, _, err = run_main(["order", "spot", "--model", "l4", "--bid", "0.5", "--queue", "--wait", "--timeout",
                             "10m"], client_=client(stub)[0])
    assert code == EXIT_API
    assert f"gave up waiting after 10m: order {ORDER[:8]} is queued" in err
    assert f"it goes on: gpum order show {ORDER[:8]}" in err
