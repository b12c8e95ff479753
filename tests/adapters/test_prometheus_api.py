"""The Prometheus reader against a synthetic Prometheus over real HTTP: what is not
Prometheus, too big, too slow, too deep or unreachable is one PrometheusError line;
100k series are refused after one small query; NaN and Inf are counted apart; every
sampling query stays within its bound of samples, and the pieces cover the window."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import ssl
import time

import pytest

from gpuslice.adapters.prometheus import Limits, PrometheusApi, PrometheusError, gather
from gpuslice.adapters.prometheus.secured import tls_failure
from gpuslice.config.prometheus_access import PrometheusAccess
from gpuslice.core.advice import Rules, advise
from gpuslice.testing.prometheus import Answer, SyntheticPrometheus, ok

END = 1_800_000_000.0
WEEK = 7 * 86400.0


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def fixed(answer: Answer) -> SyntheticPrometheus:
    return SyntheticPrometheus(0, respond=lambda path, params: answer)


def read(url: str, limits: Limits | None = None) -> None:
    gather(PrometheusApi(url, limits or Limits()), END, WEEK, 30)


def one_line(exc: pytest.ExceptionInfo[PrometheusError]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    assert len(text) < 500, text
    return text


def test_an_unreachable_prometheus_is_one_line() -> None:
    with pytest.raises(PrometheusError) as exc:
        read(closed_port())
    assert "cannot reach Prometheus at http://127.0.0.1:" in one_line(exc)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ((200, "text/html", b"<html>Grafana</html>"), "HTTP 200, content-type 'text/html'"),
        ((200, "application/json", b'{"hello": "world"}'), "Object missing required field"),
        ((200, "application/json", b"not json"), "malformed"),
        ((404, "text/plain", b"404 page not found"), "HTTP 404"),
        ((302, "text/html", b""), "HTTP 302"),
        ((200, "application/json", b'{"status": "success", "data": {"resultType": "matrix", '
          b'"result": [{"metric": {}, "values": [[1, "2"]]}]}}'), "missing required field"),
        ((200, "application/json", b'{"status":"success","data":{"resultType":"vector",'
          b'"result":' + b"[" * 5000 + b"]" * 5000 + b"}}"), ""),
    ],
)  # fmt: skip
def test_an_answer_that_is_not_prometheus_is_one_line(answer: Answer, why: str) -> None:
    with fixed(answer) as fake, pytest.raises(PrometheusError) as exc:
        read(fake.url)
    text = one_line(exc)
    assert f"{fake.url} does not answer as Prometheus' HTTP API" in text
    assert why in text


def test_a_redirect_is_not_followed() -> None:
    with fixed((302, "text/html", b"")) as fake:
        fake.respond = lambda path, params: (302, "text/html", b"")
        with pytest.raises(PrometheusError):
            read(fake.url)
        assert len(fake.requests) == 1


def test_prometheus_refusing_a_query_says_why() -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"1:1: parse error"}'
    with fixed((400, "application/json", body)) as fake, pytest.raises(PrometheusError) as exc:
        read(fake.url)
    assert "refused the query (bad_data: 1:1: parse error): count(" in one_line(exc)


def test_an_answer_over_the_size_cap_is_refused() -> None:
    with SyntheticPrometheus(200) as fake, pytest.raises(PrometheusError) as exc:
        read(fake.url, Limits(max_body=64 << 10))
    assert f"{fake.url} answered more than 65,536 bytes for one query" in one_line(exc)


def test_a_slow_answer_is_cut_at_the_deadline() -> None:
    def slow(path: str, params: dict[str, str]) -> Answer:
        time.sleep(2)
        return ok("vector", b"[]")

    with SyntheticPrometheus(0, respond=slow) as fake:
        started = time.monotonic()
        with pytest.raises(PrometheusError) as exc:
            read(fake.url, Limits(timeout_s=0.3))
        assert time.monotonic() - started < 1.5
    assert "timed out" in one_line(exc)


def test_100k_series_are_refused_after_one_small_query() -> None:
    with SyntheticPrometheus(100_000) as fake:
        with pytest.raises(PrometheusError) as exc:
            read(fake.url)
        assert len(fake.requests) == 1
    assert one_line(exc) == (
        "100000 container series in the window, more than the 20000 one advice reads; "
        "narrow it with --namespace"
    )


def test_a_window_without_data_reads_nothing_more() -> None:
    with SyntheticPrometheus(0) as fake:
        assert gather(PrometheusApi(fake.url), END, WEEK, 30) == {}
        assert len(fake.requests) == 1


SUBQUERY = re.compile(r"\[(\d+)ms:(\d+)ms\]\)$")


def test_sampling_queries_stay_within_their_bound_and_cover_the_window() -> None:
    limits = Limits(max_samples=2_000_000)
    with SyntheticPrometheus(100) as fake:
        facts = gather(PrometheusApi(fake.url, limits), END, WEEK, 30)
        pieces = [
            (float(p["time"]), int(m.group(1)) / 1000, int(m.group(2)) / 1000)
            for path, p in fake.requests
            if (m := SUBQUERY.search(p.get("query", ""))) and "memory" in p["query"]
        ]
    assert len(pieces) == 2  # 20,160 steps x 100 series = 2.016 million samples
    assert all(length / step * 100 <= limits.max_samples for _, length, step in pieces)
    assert sum(length for _, length, _ in pieces) == WEEK
    ends = sorted(t for t, _, _ in pieces)
    assert ends[1] - ends[0] == max(length for _, length, _ in pieces)  # end to end
    assert all(f.memory.count == 20160 for f in facts.values())  # each step once


def test_nan_and_inf_samples_are_counted_apart_and_said() -> None:
    def with_bad(fake: SyntheticPrometheus) -> None:
        def respond(path: str, params: dict[str, str]) -> Answer:
            status, ctype, body = fake.synthetic(path, params)
            if "count_values" in params.get("query", "") and "memory" in params["query"]:
                answer = json.loads(body)
                first = dict(answer["data"]["result"][0]["metric"])
                for v in ("NaN", "+Inf"):
                    point = [float(params["time"]), "7"]
                    answer["data"]["result"].append({"metric": {**first, "v": v}, "value": point})
                body = json.dumps(answer).encode()
            return status, ctype, body

        fake.respond = respond

    with SyntheticPrometheus(4) as fake:
        with_bad(fake)
        facts = gather(PrometheusApi(fake.url), END, 86400.0, 30)
    (first, *_) = advise(facts, Rules(30, 120))
    assert "14 samples not finite (NaN/Inf), ignored" in first.notes
    assert first.samples == 2880
    assert first.memory_p95 is not None


def test_a_value_that_is_not_a_number_is_one_line() -> None:
    bad = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"lots"]}]}}'  # noqa: E501
    with fixed((200, "application/json", bad)) as fake, pytest.raises(PrometheusError) as exc:
        read(fake.url)
    assert "is not a count: 'lots'" in one_line(exc)


def test_nan_and_inf_facts_read_as_absent_and_the_advice_stays_finite() -> None:
    with SyntheticPrometheus(2) as fake:

        def respond(path: str, params: dict[str, str]) -> Answer:
            query = params.get("query", "")
            if "allocated_ratio" in query or "gpu_memory_total_bytes" in query:
                item = '{"metric":{"UUID":"GPU-00000000","pod":"job0-7f9c8d6b5-00000"},'
                body = f'[{item}"value":[1,"NaN"]}},{item}"value":[1,"+Inf"]}}]'
                return ok("vector", body.encode())
            return fake.synthetic(path, params)

        fake.respond = respond
        facts = gather(PrometheusApi(fake.url), END, 86400.0, 30)
    found = advise(facts, Rules(30, 120))
    assert all(a.share is None and a.gpu_memory is None for a in found)
    assert all(a.verdict == "unknown" for a in found)
    json.dumps([dataclasses.asdict(a) for a in found], allow_nan=False)  # what --output json does


def test_a_tls_exchange_ended_without_an_alert_still_names_the_client_certificate() -> None:
    """Under TLS 1.3 a server refusing a client certificate may close before its alert
    arrives: the client sees an EOF, and the line still says what to look at."""
    eof = ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:2427)")
    mine = PrometheusAccess("https://p:9090", cert_file="/pki/c.crt", key_file="/pki/c.key")
    assert tls_failure(eof, mine).startswith(
        "it refused the client certificate /pki/c.crt, or ended the TLS exchange"
    )
    none = tls_failure(eof, PrometheusAccess("https://p:9090", ca_file="/pki/ca.crt"))
    assert none.startswith("it asks for a client certificate, or ended the TLS exchange")
    assert none.endswith("--prometheus-key-file (GPUSLICE_PROMETHEUS_KEY_FILE)")
