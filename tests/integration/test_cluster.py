"""One budget controller and three serving nodes as separate processes on loopback.

Everything runs with TLS (mTLS towards the controller) and bearer tokens. The nodes serve the
embedded model with the n-gram drafter, fixed local K = 8, and share a pool budget of 12: the
idle split is 4 / 4 / 4. n0 has an explicit ``--node-id``; n1 and n2 both start with
``--listen 127.0.0.1:0`` and no id (the case where two nodes once shared one id and fought).
The last two tests are destructive (a node, then the controller, is killed) and run last.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_proto.serving.v1 import serving_pb2 as spb
from echo_proto.serving.v1 import serving_pb2_grpc

from .conftest import TOKEN, Certs, Proc, budget_sample, open_channel, spawn

pytestmark = pytest.mark.slow

GLOBAL_BUDGET, K_MAX, TTL_MS, REPORT_MS, SLACK_MS = 12, 8, 2500, 250, 500
MAX_TOKENS_LIMIT, VOCAB = 64, 49152
AUTH = (("authorization", f"Bearer {TOKEN}"),)
T = 120.0  # call timeout: three engines share two cores
NODES = ("n0", "n1", "n2")


@dataclass
class Cluster:
    certs: Certs
    work: Path
    controller: Proc
    nodes: dict[str, Proc]
    channels: dict[str, grpc.Channel] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # node id (the controller's key) -> name

    def stub(self, node: str) -> serving_pb2_grpc.GenerationServiceStub:
        if node not in self.channels:
            creds = self.certs.channel_credentials()
            self.channels[node] = open_channel(self.nodes[node].target, creds)
        return serving_pb2_grpc.GenerationServiceStub(self.channels[node])

    def stats(self, node: str) -> spb.GetStatsResponse:
        return self.stub(node).GetStats(spb.GetStatsRequest(), metadata=AUTH, timeout=T)

    def committed(self) -> tuple[float, float, dict[str, float]]:
        """(pool committed, pool budget, per-node committed) from the controller's metrics."""
        m = self.controller.metrics()
        nodes = {
            self.ids.get(node_id, node_id): value
            for key, value in m.items()
            if key.startswith("echo_controller_node_committed_k{")
            for node_id in [key.split('"')[1]]
        }
        pool = m.get('echo_controller_pool_committed_tokens{pool="dp"}', 0.0)
        budget = m.get('echo_controller_pool_budget_tokens{pool="dp"}', float(GLOBAL_BUDGET))
        return pool, budget, nodes


def _controller_args(c: Certs, work: Path, listen: str) -> list[str]:
    return [
        "controller",
        "--listen", listen,
        "--global-budget", str(GLOBAL_BUDGET),
        "--lease-ttl-ms", str(TTL_MS),
        "--lease-slack-ms", str(SLACK_MS),
        "--report-interval-ms", str(REPORT_MS),
        "--tls-cert", str(c.server_cert),
        "--tls-key", str(c.server_key),
        "--tls-client-ca", str(c.ca),
        "--token-file", str(c.token_file),
        "--state-file", str(work / "controller.state"),
        "--metrics-listen", "127.0.0.1:0",
    ]  # fmt: skip


def _node_args(name: str, controller: Proc, c: Certs) -> list[str]:
    return [
        "serve",
        "--listen", "127.0.0.1:0",
        *(["--node-id", name] if name == "n0" else []),
        "--pool", "dp",
        "--controller", controller.target,
        "--controller-ca", str(c.ca),
        "--controller-cert", str(c.client_cert),
        "--controller-key", str(c.client_key),
        "--controller-token-file", str(c.token_file),
        "--tls-cert", str(c.server_cert),
        "--tls-key", str(c.server_key),
        "--token-file", str(c.token_file),
        "--budget", str(K_MAX),
        "--max-batch", "2",
        "--max-waiting", "2",
        "--kv-slots", "1024",
        "--threads", "1",
        "--default-max-tokens", "4",
        "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
        "--grace-s", "2",
        "--metrics-listen", "127.0.0.1:0",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("cluster")
    creds = certs.channel_credentials()
    controller = spawn("controller", _controller_args(certs, work, "127.0.0.1:0"), work)
    procs = [controller]
    try:
        controller.wait_ready(creds)
        nodes = {n: spawn(n, _node_args(n, controller, certs), work) for n in NODES}
        procs += nodes.values()
        for node in nodes.values():  # loading in parallel
            node.wait_ready(creds)
        cluster = Cluster(certs, work, controller, nodes)
        cluster.ids = {cluster.stats(n).node_id: n for n in NODES}
        _eventually(lambda: all(cluster.stats(n).lease_epoch > 0 for n in NODES), "first leases")
        yield cluster
        procs = [cluster.controller, *cluster.nodes.values()]
        for channel in cluster.channels.values():
            channel.close()
    finally:
        for proc in procs:
            proc.stop()


def _eventually(check: object, what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _request(max_tokens: int = 4, text: str = "Name three fruits.") -> spb.GenerateRequest:
    return spb.GenerateRequest(
        text=text, chat=True, sampling=spb.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )


def _wait_idle(cluster: Cluster, node: str) -> spb.GetStatsResponse:
    end = time.monotonic() + 60
    while True:
        stats = cluster.stats(node)
        if stats.running == 0 and stats.waiting == 0:
            return stats
        assert time.monotonic() < end, f"{node} still busy: {stats}"
        time.sleep(0.05)


def test_nodes_without_an_id_get_distinct_ones_from_their_bound_ports(cluster: Cluster) -> None:
    ids = {n: cluster.stats(n).node_id for n in NODES}
    assert len(set(ids.values())) == len(NODES), ids
    for n in ("n1", "n2"):
        assert ids[n].endswith(f"/127.0.0.1:{cluster.nodes[n].grpc_port}"), ids
    _eventually(lambda: set(cluster.committed()[2]) == set(NODES), "a lease for every node")
    refused = cluster.controller.metrics()
    assert refused.get('echo_controller_calls_refused_total{code="FAILED_PRECONDITION"}', 0) == 0
    assert "node_id_conflict" not in "".join(p.log.read_text() for p in cluster.nodes.values())


def test_leases_stay_within_the_global_budget_while_nodes_serve(cluster: Cluster) -> None:
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [
            pool.submit(cluster.stub(n).Generate, _request(), metadata=AUTH, timeout=T)
            for n in NODES
            for _ in range(2)
        ]
        observations = 0
        while observations < 20 or not all(f.done() for f in futures):
            total, budget, per_node = cluster.committed()
            assert total <= budget == GLOBAL_BUDGET
            assert all(0 <= k <= K_MAX for k in per_node.values())
            for n in NODES:
                stats = cluster.stats(n)
                assert stats.lease_budget_k <= K_MAX
                assert stats.budget_k <= K_MAX
            observations += 1
        answers = [f.result() for f in futures]
    assert all(a.finish_reason == spb.FINISH_REASON_LENGTH for a in answers)
    assert all(a.stats.output_tokens == 4 for a in answers)
    assert all(cluster.stats(n).lease_epoch > 0 for n in NODES)


def test_a_cancelled_stream_frees_its_slot_and_a_deadline_cancels_its_request(
    cluster: Cluster,
) -> None:
    stub = cluster.stub("n0")
    before = _wait_idle(cluster, "n0").output_tokens_total
    stream = stub.GenerateStream(
        spb.GenerateStreamRequest(request=_request(MAX_TOKENS_LIMIT)), metadata=AUTH, timeout=T
    )
    first = next(stream)
    assert first.WhichOneof("event") == "delta"
    stream.cancel()
    after_cancel = _wait_idle(cluster, "n0").output_tokens_total
    assert after_cancel - before < MAX_TOKENS_LIMIT

    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(_request(MAX_TOKENS_LIMIT), metadata=AUTH, timeout=1.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _wait_idle(cluster, "n0").output_tokens_total - after_cancel < MAX_TOKENS_LIMIT


def test_the_generation_api_refuses_clients_without_token_or_tls(cluster: Cluster) -> None:
    target = cluster.nodes["n1"].target
    with pytest.raises(grpc.RpcError) as no_token:
        cluster.stub("n1").GetStats(spb.GetStatsRequest(), timeout=T)
    with open_channel(target, None) as plain, pytest.raises(grpc.RpcError) as no_tls:
        serving_pb2_grpc.GenerationServiceStub(plain).GetStats(
            spb.GetStatsRequest(), metadata=AUTH, timeout=T
        )
    assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert no_tls.value.code() == grpc.StatusCode.UNAVAILABLE


# -- fuzzing ---------------------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=24)


@st.composite
def _valid_requests(draw: st.DrawFn) -> spb.GenerateRequest:
    """Requests the node should serve (or, for huge prompts, refuse as never fitting)."""
    sampling = spb.SamplingParams(
        temperature=draw(st.one_of(st.just(0.0), st.floats(0.0, 2.0))),
        top_k=draw(st.integers(0, 50)),
        top_p=draw(st.floats(0.0, 1.0)),
        max_tokens=draw(st.integers(0, 3)),
        seed=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        stop=draw(st.lists(TEXT.filter(bool), max_size=2)),
        ignore_eos=draw(st.booleans()),
    )
    request = spb.GenerateRequest(
        request_id=draw(st.one_of(st.just(""), TEXT.filter(str.isprintable))),
        sampling=sampling,
        policy=draw(st.sampled_from([None, "echo"])),
    )
    if draw(st.booleans()):
        request.text = draw(st.one_of(TEXT.filter(str.strip), st.just("word " * 12_000)))
        request.chat = draw(st.booleans())
    else:
        request.token_ids.ids.extend(draw(st.lists(st.integers(0, 300), min_size=1, max_size=4)))
    return request


def _mutate(request: spb.GenerateRequest, what: str) -> None:
    """Break one field (out-of-range numbers, huge or empty strings, missing prompt)."""
    s = request.sampling
    if what == "temperature":
        s.temperature = -1.0 if s.seed % 2 else math.nan
    elif what == "top_k":
        s.top_k = -(2**31)
    elif what == "top_p":
        s.top_p = math.inf if s.seed % 2 else 1.5
    elif what == "max_tokens":
        s.max_tokens = 2**32 - 1
    elif what == "stop":
        s.stop.append("")
    elif what == "request_id":
        request.request_id = "r" * 200
    elif what == "policy":
        request.policy = "unknown"
    elif what == "prompt":
        request.ClearField("prompt")
    elif what == "empty_text":
        request.text = "   "
    elif what == "huge_text":
        request.text = "x" * 70_000
    elif what == "token_id":
        request.token_ids.ids.append(2**32 - 1)
    elif what == "chat_with_ids":
        request.token_ids.ids.append(1)
        request.chat = True


MUTATIONS = [
    "temperature", "top_k", "top_p", "max_tokens", "stop", "request_id", "policy", "prompt",
    "empty_text", "huge_text", "token_id", "chat_with_ids",
]  # fmt: skip


@st.composite
def _requests(draw: st.DrawFn) -> spb.GenerateRequest:
    request = draw(_valid_requests())
    for what in draw(st.lists(st.sampled_from(MUTATIONS), max_size=2)):
        _mutate(request, what)
    return request


REQUESTS = _requests()


def _invalid(r: spb.GenerateRequest) -> bool:
    """The documented validation rules (serving.proto and RequestLimits), restated."""
    s, kind = r.sampling, r.WhichOneof("prompt")
    bad_number = (
        not math.isfinite(s.temperature)
        or s.temperature < 0
        or s.top_k < 0
        or not (math.isfinite(s.top_p) and 0 <= s.top_p <= 1)
        or s.max_tokens > MAX_TOKENS_LIMIT
    )
    bad_text = kind == "text" and (not r.text.strip() or len(r.text) > 65536)
    ids = list(r.token_ids.ids)
    bad_ids = kind == "token_ids" and (r.chat or not ids or max(ids) >= VOCAB)
    return (
        kind is None
        or bad_number
        or bad_text
        or bad_ids
        or (r.HasField("policy") and r.policy != "echo")
        or any(not stop for stop in s.stop)
        or len(r.request_id) > 128
        or not r.request_id.isprintable()
    )


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=REQUESTS)
def test_fuzzed_requests_get_the_documented_status_codes(
    cluster: Cluster, request: spb.GenerateRequest
) -> None:
    try:
        cluster.stub("n1").Generate(request, metadata=AUTH, timeout=T)
        code = grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        assert code != grpc.StatusCode.INTERNAL, details
    if _invalid(request):
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_malformed_and_oversized_messages_are_refused_briefly_and_counted(
    cluster: Cluster,
) -> None:
    generate = "/echo_proto.serving.v1.GenerationService/Generate"
    payloads = {
        "bad_utf8": b"\x12\x02\xff\xfe",  # text (field 2) holding two bytes that are not UTF-8
        "corrupt": b"\xff\xff\xff",
        "oversized": spb.GenerateRequest(text="x" * (5 << 20)).SerializeToString(),
    }
    refused = 'echo_node_requests_refused_total{code="%s"}'
    before = cluster.nodes["n1"].metrics()
    codes = {}
    with open_channel(cluster.nodes["n1"].target, cluster.certs.channel_credentials()) as ch:
        # raw bytes: no client-side encoding
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(generate)
        for name, payload in payloads.items():
            with pytest.raises(grpc.RpcError) as info:
                call(payload, metadata=AUTH, timeout=T)
            codes[name] = (info.value.code(), info.value.details())
    assert codes["bad_utf8"] == (grpc.StatusCode.INVALID_ARGUMENT, "malformed request message")
    assert codes["corrupt"] == codes["bad_utf8"]
    assert codes["oversized"][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    after = cluster.nodes["n1"].metrics()
    for code, n in (("INVALID_ARGUMENT", 2), ("RESOURCE_EXHAUSTED", 1)):
        assert after.get(refused % code, 0) - before.get(refused % code, 0) == n, code
    assert "Traceback" not in cluster.nodes["n1"].log.read_text()


def test_the_fuzzed_node_is_healthy_and_serves_afterwards(cluster: Cluster) -> None:
    with open_channel(cluster.nodes["n1"].target, cluster.certs.channel_credentials()) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=T)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    answer = cluster.stub("n1").Generate(_request(), metadata=AUTH, timeout=T)
    assert answer.stats.output_tokens == 4


# -- failures (destructive: keep last) -----------------------------------------------------------


def test_a_killed_nodes_budget_is_redistributed_after_its_ttl(cluster: Cluster) -> None:
    _eventually(lambda: cluster.committed()[2].get("n2", 0) > 0, "n2 to hold a lease")
    epoch = cluster.stats("n2").lease_epoch
    _eventually(lambda: cluster.stats("n2").lease_epoch > epoch, "a fresh renewal of n2")
    cluster.nodes["n2"].kill()  # right after a renewal: its lease has about TTL + slack left
    killed = time.monotonic()
    held_until = killed
    while True:
        total, budget, per_node = cluster.committed()
        assert total <= budget
        if "n2" in per_node:
            held_until = time.monotonic()
        elif per_node.get("n0") == per_node.get("n1") == GLOBAL_BUDGET // 2:
            break
        assert time.monotonic() - killed < 60, per_node
        time.sleep(0.05)
    assert held_until - killed >= TTL_MS / 1000  # not reused before the TTL ran out


def test_the_budget_holds_while_the_controller_is_killed_and_restarted(cluster: Cluster) -> None:
    """kill -9 the controller under load: every consistent sample of the nodes' effective K sums
    to <= G (they fall back to K = 0 at the TTL, never to their local K = 8), serving goes on,
    and the restarted controller's leases (after its quarantine) stay within G too."""
    survivors = ("n0", "n1")
    old_epochs = {n: cluster.stats(n).lease_epoch for n in survivors}
    assert all(old_epochs.values())
    port = cluster.controller.grpc_port
    samples: list[int] = []

    def sample() -> None:
        total = budget_sample([cluster.stub(n) for n in survivors], AUTH, T)
        if total is not None:
            assert total <= GLOBAL_BUDGET, total
            samples.append(total)

    with ThreadPoolExecutor(max_workers=4) as pool:
        load = [
            pool.submit(cluster.stub(n).Generate, _request(16), metadata=AUTH, timeout=T)
            for n in survivors
            for _ in range(2)
        ]
        cluster.controller.kill()
        killed = time.monotonic()
        while time.monotonic() - killed < (TTL_MS + SLACK_MS) / 1000 + 1 or not all(
            f.done() for f in load
        ):
            sample()
        answers = [f.result() for f in load]
    assert all(a.stats.output_tokens == 16 for a in answers)  # serving never stopped
    _eventually(lambda: all(cluster.stats(n).lease_epoch == 0 for n in survivors), "the TTL")
    assert all(cluster.stats(n).budget_k == 0 for n in survivors)  # the fallback: K = 0
    answer = cluster.stub("n1").Generate(_request(), metadata=AUTH, timeout=T)
    assert answer.stats.output_tokens == 4

    args = _controller_args(cluster.certs, cluster.work, f"127.0.0.1:{port}")
    cluster.controller = spawn("controller-2", args, cluster.work)
    cluster.controller.wait_ready(cluster.certs.channel_credentials())
    end = time.monotonic() + 60
    while not all(cluster.stats(n).lease_budget_k > 0 for n in survivors):
        sample()
        assert time.monotonic() < end, "no leases from the new controller"
    new_epochs = {n: cluster.stats(n).lease_epoch for n in survivors}
    assert all(new_epochs[n] >> 32 > old_epochs[n] >> 32 for n in survivors)  # new incarnation
    total, budget, _ = cluster.committed()
    assert total <= budget
    assert len(samples) >= 10, samples
