"""Custom tools end to end: registry and dispatcher and a sandbox process on 127.0.0.1, the
registry routing tool_type="custom" to sandbox.Execute, nested call_tool calls coming back
through the registry with the caller's context."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from shared.auth import key_digest
from shared.cli.main import main as toolmesh
from shared.clients import cli_channel
from shared.db.engine import make_engine, session_factory
from shared.db.models import ToolJobRow
from shared.launcher import ServiceProcess, start_service
from shared.rpc_errors import from_rpc_error
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import BACKENDS
from tests.integration.conftest import Mesh, backend_mesh
from tests.support.fake_anthropic import FakeAnthropic, Reply, running_fake
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeAnthropic]:
    with running_fake() as fake:
        yield fake


@pytest.fixture(scope="module", params=BACKENDS)
def smesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
    fake_llm: FakeAnthropic,
) -> Iterator[Mesh]:
    """The mesh plus a sandbox process the registry routes custom tools to."""
    extra = {
        "TOOLMESH_SANDBOX_WALL_S": "10",
        "TOOLMESH_SANDBOX_CPU_S": "5",
        "TOOLMESH_TOOL_CACHE_TTL_S": "0",
        "TOOLMESH_SECRET_FOR_TEST": "do-not-leak-4242",
        "ANTHROPIC_API_KEY": "test-key",
        "ANTHROPIC_BASE_URL": fake_llm.base_url,
    }
    with backend_mesh(
        request, tmp_path_factory, collector, "sandbox", extra, services=["sandbox"]
    ) as m:
        yield m


def sandbox(m: Mesh) -> sandbox_pb2_grpc.SandboxServiceStub:
    return sandbox_pb2_grpc.SandboxServiceStub(m._channel("sandbox"))


def register(
    m: Mesh, name: str, code: str, tenant: str = "tenant-a", schema: dict | None = None
) -> pb.ToolDefinition:
    response = sandbox(m).RegisterCustomTool(
        spb.RegisterCustomToolRequest(
            tool=pb.ToolDefinition(
                name=name,
                description=f"custom tool {name}",
                implementation=code,
                input_schema_json=json.dumps(schema or {"type": "object"}),
                tenant_id=tenant,
            )
        ),
        timeout=30,
    )
    return response.tool


def approve(m: Mesh, name: str) -> None:
    m.registry.SetToolStatus(
        rpb.SetToolStatusRequest(name=name, status=pb.TOOL_STATUS_APPROVED), timeout=30
    )


def add(m: Mesh, name: str, code: str, tenant: str = "tenant-a", **kw: object) -> None:
    register(m, name, code, tenant, **kw)  # type: ignore[arg-type]
    approve(m, name)


def kind(response: object) -> str:
    return response.result.envelope.WhichOneof("kind")  # type: ignore[attr-defined]


def test_a_registered_tool_is_a_draft_until_approved_then_runs(smesh: Mesh) -> None:
    tool = register(
        smesh,
        "shout",
        "result = inputs['text'].upper() + '!'",
        schema={"type": "object", "properties": {"text": {"type": "string"}}},
    )
    assert tool.status == pb.TOOL_STATUS_DRAFT and tool.version == 1
    refused = smesh.call("shout", '{"text": "hi"}')
    assert refused.result.envelope.err.err_kind == "tool_not_approved"
    approve(smesh, "shout")
    response = smesh.call("shout", '{"text": "hi"}')
    assert kind(response) == "ok", response.result.content
    assert response.result.content == "HI!"
    names = [
        t.name
        for t in smesh.registry.GetToolsForLLM(
            rpb.GetToolsForLLMRequest(tenant_id="tenant-a")
        ).tools
    ]
    assert "shout" in names
    other = [
        t.name
        for t in smesh.registry.GetToolsForLLM(
            rpb.GetToolsForLLMRequest(tenant_id="tenant-b")
        ).tools
    ]
    assert "shout" not in other
    again = register(smesh, "shout", "result = inputs['text'].lower()")
    assert again.version == 2 and again.status == pb.TOOL_STATUS_DRAFT


def test_benign_programs_return_correct_results(smesh: Mesh) -> None:
    loaded = smesh.call(
        "load_dataset", '{"path": "people.csv", "name": "people"}', conversation="c1"
    )
    assert kind(loaded) == "ok", loaded.result.content
    add(
        smesh,
        "city_counts",
        "counts = df.groupby('city', as_index=False).agg(n=('id', 'count'))\n"
        "result = counts.sort_values('city').reset_index(drop=True)",
    )
    response = smesh.call("city_counts", "{}", conversation="c1")
    assert kind(response) == "ok", response.result.content
    table = response.result.envelope.ok
    assert table.rows >= 4 and "London" in response.result.content
    add(
        smesh,
        "words",
        "class Counter:\n    def __init__(self, text):\n        self.words = text.split()\n"
        "result = {'message': ' '.join(sorted(w.lower() for w in Counter(inputs['s']).words)),"
        " 'cards': [{'n': len(inputs['s'])}]}",
    )
    words = smesh.call("words", '{"s": "b A c"}')
    # A dict with `message` is a full response: its message and cards reach the model.
    assert words.result.content.splitlines()[-1] == "a b c", words.result.content
    assert list(words.result.cards[0].fields) == ["n"]
    add(smesh, "spread", "result = float(np.array(inputs['xs']).std())")
    assert smesh.call("spread", '{"xs": [1, 1, 1]}').result.content == "0.0"


def test_call_tool_composes_and_unknown_tools_come_back_as_results(smesh: Mesh) -> None:
    add(
        smesh,
        "echo_twice",
        "a = call_tool('ping', {'echo': {'n': 1}})\n"
        "b = call_tool('no_such_tool', {})\n"
        "result = {'message': 'ok', 'first': a['ok'], 'missing': b['code'], 'err': b['kind']}",
    )
    response = smesh.call("echo_twice")
    assert kind(response) == "ok", response.result.content
    assert response.result.content.splitlines()[-1] == "ok"
    add(
        smesh,
        "echo_report",
        "a = call_tool('ping', {'echo': {'n': 1}})\nb = call_tool('no_such_tool', {})\n"
        "result = str(a['ok']) + ' ' + b['code'] + ' ' + b['kind']",
    )
    assert smesh.call("echo_report").result.content == "True NOT_FOUND err"


def test_another_tenants_tool_is_unreachable_through_call_tool(smesh: Mesh) -> None:
    add(smesh, "b_secret", "result = 'tenant b data'", tenant="tenant-b")
    assert smesh.call("b_secret", tenant="tenant-b").result.content == "tenant b data"
    add(
        smesh,
        "a_snoop",
        "r = call_tool('b_secret', {})\nresult = r['kind'] + ':' + str(r.get('code'))",
    )
    assert smesh.call("a_snoop").result.content == "err:NOT_FOUND"
    with pytest.raises(grpc.RpcError) as info:
        smesh.call("b_secret")  # tenant-a directly: unknown, and not even suggested
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "b_secret" not in (info.value.details() or "").partition("did you mean")[2]


def test_bad_code_is_a_hint_or_an_err_the_model_can_act_on(smesh: Mesh) -> None:
    stub = sandbox(smesh)
    bad = stub.Execute(spb.ExecuteRequest(tool_name="t", code="x = (1,\n", input_json="{}"))
    assert bad.result.envelope.hint.hint_kind == pb.HINT_KIND_SCHEMA
    assert "line" in bad.result.envelope.hint.message
    none = stub.Execute(spb.ExecuteRequest(tool_name="t", code="x = 1", input_json="{}"))
    assert none.result.envelope.err.err_kind == "no_result"
    big = stub.Execute(
        spb.ExecuteRequest(
            tool_name="t",
            code="result = 'x' * 100000",
            input_json="{}",
            limits=spb.ExecutionLimits(output_bytes=1000),
        )
    )
    assert big.result.envelope.err.err_kind == "output_limit"
    with pytest.raises(grpc.RpcError) as info:
        register(smesh, "broken", "def f(:\n")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_tenants_input_pattern_cannot_stall_the_registry(smesh: Mesh) -> None:
    """`^(a+)+$` against 'aaa…a!' backtracks for ages in Python's `re` (1.2 s at 24 characters,
    doubling with each): on the registry's loop, every tenant's calls would wait. On RE2 it is
    an ordinary schema hint."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    add(smesh, "redos", "result = inputs['s']", schema=schema)
    refused = smesh.call(
        "redos", json.dumps({"s": "a" * 60 + "!"}), conversation="redos", timeout=20
    )
    assert refused.result.envelope.hint.hint_kind == pb.HINT_KIND_SCHEMA
    assert "does not match" in refused.result.envelope.hint.message
    ok = smesh.call("redos", json.dumps({"s": "aaaa"}), conversation="redos-ok", timeout=20)
    assert kind(ok) == "ok"
    lookahead = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)b"}}}
    with pytest.raises(grpc.RpcError) as info:
        register(smesh, "lookahead", "result = 1", schema=lookahead)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "RE2" in info.value.details()


def test_the_service_keeps_serving_while_one_execution_misbehaves(smesh: Mesh) -> None:
    stub = sandbox(smesh)
    results: dict[str, object] = {}

    def spin() -> None:
        results["spin"] = stub.Execute(
            spb.ExecuteRequest(
                tool_name="spin",
                code="while True:\n    pass",
                input_json="{}",
                limits=spb.ExecutionLimits(wall_seconds=4, cpu_seconds=2),
            ),
            timeout=60,
        )

    thread = threading.Thread(target=spin)
    thread.start()
    quick = stub.Execute(spb.ExecuteRequest(tool_name="q", code="result = 41 + 1"), timeout=30)
    assert quick.result.content == "42"
    thread.join(60)
    spun = results["spin"]
    assert spun.result.envelope.err.err_kind in ("cpu_limit", "timeout")  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as info:
        stub.Execute(
            spb.ExecuteRequest(tool_name="slow", code="while True:\n    pass"), timeout=1.0
        )
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = stub.Execute(spb.ExecuteRequest(tool_name="q", code="result = 'alive'"), timeout=30)
    assert after.result.content == "alive"


def test_hostile_code_through_the_service_is_refused_or_contained(smesh: Mesh) -> None:
    stub = sandbox(smesh)
    refused = stub.Execute(
        spb.ExecuteRequest(tool_name="t", code="result = ().__class__.__base__.__subclasses__()")
    )
    assert refused.result.envelope.err.err_kind == "code_rejected"
    # A format-string walk gets past the AST check; it still finds nothing to leak.
    leak = stub.Execute(
        spb.ExecuteRequest(
            tool_name="t",
            code="result = '{0.__class__.__base__.__subclasses__}'.format(()) + "
            "str(len(repr(inputs)))",
        )
    )
    assert kind(leak) == "ok"
    assert "do-not-leak-4242" not in leak.result.content
    read = stub.Execute(
        spb.ExecuteRequest(tool_name="t", code="result = pd.read_csv('/proc/1/environ')")
    )
    assert read.result.envelope.err.err_kind == "execution_error"
    assert "do-not-leak-4242" not in read.result.content


def test_the_cli_adds_approves_and_builds_tools(
    smesh: Mesh,
    fake_llm: FakeAnthropic,
    tmp_path: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOOLMESH_SANDBOX_ADDR", smesh.address("sandbox"))
    monkeypatch.setenv("TOOLMESH_REGISTRY_ADDR", smesh.address("registry"))
    code = tmp_path / "double.py"  # type: ignore[operator]
    code.write_text("result = inputs['n'] * 2\n")
    schema = tmp_path / "double.json"  # type: ignore[operator]
    schema.write_text(
        json.dumps(
            {
                "description": "Doubles n.",
                "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            }
        )
    )
    args = ["--code", str(code), "--schema", str(schema), "--tenant", "tenant-a"]
    assert toolmesh(["tools", "add", *args]) == 0
    assert "registered double v1 (draft)" in capsys.readouterr().out
    assert toolmesh(["tools", "approve", "double"]) == 0
    assert smesh.call("double", '{"n": 21}').result.content == "42"
    assert toolmesh(["tools", "reject", "double", "--reason", "no"]) == 0
    assert smesh.call("double", '{"n": 21}').result.envelope.err.err_kind == "tool_not_approved"
    assert toolmesh(["tools", "--tenant", "tenant-a"]) == 0  # the plain listing still works

    build = {
        "name": "triple",
        "description": "Triples n.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "code": "result = inputs.get('n', 0) * 3",
        "tests": [{"inputs": {"n": 2}, "expect": "6"}],
    }
    fake_llm.script(
        Reply(text=json.dumps(build)), Reply(text='{"verdict": "approve", "reason": "fine"}')
    )
    capsys.readouterr()
    status = toolmesh(
        ["jobs", "build", "triple a number", "--tenant", "tenant-a", "--wait", "60", "--json"]
    )
    job = json.loads(capsys.readouterr().out)
    assert status == 0 and job["status"] == "JOB_STATUS_APPROVED", job
    assert smesh.call("triple", '{"n": 5}').result.content == "15"
    assert toolmesh(["jobs", "list", "--tenant", "tenant-a"]) == 0
    assert job["id"] in capsys.readouterr().out
    assert toolmesh(["jobs", "show", job["id"], "--tenant", "tenant-b"]) == 2  # not theirs


def test_a_build_submitted_again_with_its_request_id_is_built_once(
    smesh: Mesh,
    fake_llm: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A retried submission (the answer lost, UNAVAILABLE) must not build, and pay for, the
    tool twice: with an idempotency key it gets the first submission's job."""
    monkeypatch.setenv("TOOLMESH_SANDBOX_ADDR", smesh.address("sandbox"))
    build = {
        "name": "quadruple",
        "description": "Quadruples n.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "code": "result = inputs.get('n', 0) * 4",
        "tests": [{"inputs": {"n": 2}, "expect": "8"}],
    }
    sent = len(fake_llm.requests)
    fake_llm.script(
        Reply(text=json.dumps(build)), Reply(text='{"verdict": "approve", "reason": "fine"}')
    )
    argv = ["jobs", "build", "quadruple a number", "--tenant", "tenant-a", "--json"]
    capsys.readouterr()
    assert toolmesh([*argv, "--request-id", "order-7", "--wait", "60"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["status"] == "JOB_STATUS_APPROVED", first
    assert toolmesh([*argv, "--request-id", "order-7"]) == 0
    out = capsys.readouterr()
    again = json.loads(out.out)
    assert again["id"] == first["id"] and again["status"] == "JOB_STATUS_APPROVED"
    assert "submitted before" in out.err
    assert len(fake_llm.requests) == sent + 2  # one builder and one auditor call: built once

    stub, ctx = sandbox(smesh), pb.CallContext(tenant_id="tenant-a")
    replay = stub.SubmitBuildJob(
        spb.SubmitBuildJobRequest(request="quadruple a number", context=ctx, request_id="order-7"),
        timeout=30,
    )
    assert replay.replayed and replay.job.id == first["id"]
    other = spb.SubmitBuildJobRequest(request="halve a number", context=ctx, request_id="order-7")
    assert refused(stub.SubmitBuildJob, other) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "REQUEST_ID_REUSED",
    )
    for bad in ("x" * 129, "tab\there"):
        malformed = spb.SubmitBuildJobRequest(request="q", context=ctx, request_id=bad)
        assert refused(stub.SubmitBuildJob, malformed)[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert smesh.call("quadruple", '{"n": 5}').result.content == "20"


def test_nested_calls_are_traced_and_costed_under_the_parent_call(smesh: Mesh) -> None:
    add(
        smesh,
        "ask_twice",
        "a = call_tool('call_llm', {'prompt': 'one'})\n"
        "b = call_tool('ping', {'echo': {'n': 2}})\n"
        "result = a['kind'] + ' ' + b['kind']",
    )
    call_id = f"tu-nested-{smesh.backend}"  # one collector serves both backends' meshes
    response = smesh.call("ask_twice", tool_use_id=call_id)
    assert response.result.content == "ok ok", response.result.content
    assert response.result.cost_usd > 0  # the nested LLM call's cost rolls up to the parent
    (root,) = smesh.spans.wait_for_sync(
        lambda s: (
            s.name == "execute_tool ask_twice"
            and s.attributes.get("gen_ai.tool.call.id") == call_id
        ),
        timeout=15,
    )
    (nested,) = smesh.spans.wait_for_sync(
        lambda s: s.name == "execute_tool call_llm" and s.trace_id == root.trace_id, timeout=15
    )
    smesh.spans.wait_for_sync(
        lambda s: s.name == "sandbox.call_tool" and s.trace_id == root.trace_id,
        timeout=15,
        count=2,
    )
    # Each process exports on its own schedule: the sandbox's span of the run can land after
    # the registry's root span, so wait for it too before walking the chain.
    smesh.spans.wait_for_sync(
        lambda s: s.name == "sandbox.execute" and s.trace_id == root.trace_id, timeout=15
    )
    by_id = {s.span_id: s for s in smesh.spans.spans(root.trace_id)}
    chain, span = [], nested
    while span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        chain.append(span.name)
    assert "sandbox.call_tool" in chain and "sandbox.execute" in chain
    assert chain.index("sandbox.execute") < chain.index("execute_tool ask_twice")


def _sandbox_processes(root: int) -> list[dict[str, str]]:
    """/proc/<pid>/status (as the host sees it) of every zygote and worker below `root`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - below
        below |= frontier
    found = []
    for pid in below:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"/sbx/worker.py" not in argv or argv[0].endswith(b"bwrap"):
                continue  # not the zygote or a worker (bwrap itself stays root, no capabilities)
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue  # exited meanwhile
        found.append({k: v.strip() for k, v in (line.split(":", 1) for line in lines)})
    return found


def test_a_custom_tools_worker_runs_as_an_unprivileged_host_uid_without_capabilities(
    smesh: Mesh,
) -> None:
    stub = sandbox(smesh)
    stub.RegisterCustomTool(
        spb.RegisterCustomToolRequest(
            tool=pb.ToolDefinition(
                name="spinner",
                implementation="while True:\n    pass",
                tenant_id="tenant-a",
                timeout_seconds=3,
            )
        ),
        timeout=30,
    )
    approve(smesh, "spinner")
    call = smesh.dispatcher.DispatchToolCall.future(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name="spinner", input_json="{}"),
            context=pb.CallContext(tenant_id="tenant-a", user_id="tester", conversation_id="c"),
        ),
        timeout=60,
    )
    service = smesh.processes["sandbox"].process.pid
    deadline = time.monotonic() + 20
    while True:  # until the spinning worker is seen running
        processes = _sandbox_processes(service)
        if any(p["State"].startswith("R") for p in processes) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert any(p["State"].startswith("R") for p in processes), processes
    expected = 65534 if os.geteuid() == 0 else os.geteuid()
    for status in processes:  # the zygote, the running worker and the pre-started ones
        assert status["Uid"].split() == [str(expected)] * 4, status
        assert "0" not in status["Gid"].split() and status["Groups"] == "", status
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0, status
        if os.geteuid() == 0:
            assert int(status["CapBnd"], 16) == int(status["CapInh"], 16) == 0, status
    assert call.result().result.envelope.err.err_kind == "timeout"


KEYS = {
    "sbx-key-a": {"name": "builder-a", "tenant_id": "tenant-a"},
    "sbx-key-b": {"name": "builder-b", "tenant_id": "tenant-b"},
    "sbx-key-admin": {"name": "ops", "tenant_id": "ops", "admin": True},
}


@pytest.fixture(scope="module")
def keyed_sandbox(
    smesh: Mesh, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """A second sandbox on the same database, with API keys configured (and no job workers)."""
    path = tmp_path_factory.mktemp("sandbox-keys") / "keys.json"
    entries = [{"key_sha256": key_digest(k), **v} for k, v in KEYS.items()]
    path.write_text(json.dumps({"keys": entries}))
    env = {**smesh.env, "TOOLMESH_API_KEYS_FILE": str(path), "TOOLMESH_SANDBOX_JOB_WORKERS": "0"}
    proc = start_service("sandbox", env=env, port=0)
    yield proc
    proc.stop()


def as_key(smesh: Mesh, address: str, key: str | None) -> sandbox_pb2_grpc.SandboxServiceStub:
    channel = cli_channel(address, api_key=key or "")
    smesh.channels.append(channel)
    return sandbox_pb2_grpc.SandboxServiceStub(channel)


def refused(call: object, *args: object) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=30)  # type: ignore[operator]
    return info.value.code(), str(from_rpc_error(info.value).reason)


def tool_request(name: str, tenant: str = "") -> spb.RegisterCustomToolRequest:
    return spb.RegisterCustomToolRequest(
        tool=pb.ToolDefinition(name=name, implementation="result = 'keyed'", tenant_id=tenant)
    )


def review(name: str, tenant: str = "") -> spb.SetCustomToolStatusRequest:
    return spb.SetCustomToolStatusRequest(
        name=name, tenant_id=tenant, status=pb.TOOL_STATUS_APPROVED
    )


def test_with_api_keys_the_admin_rpcs_need_a_key_allowed_for_the_tenant(
    smesh: Mesh, keyed_sandbox: ServiceProcess
) -> None:
    address = keyed_sandbox.address
    anonymous, stranger = as_key(smesh, address, None), as_key(smesh, address, "not-a-key")
    a, b = as_key(smesh, address, "sbx-key-a"), as_key(smesh, address, "sbx-key-b")
    admin = as_key(smesh, address, "sbx-key-admin")
    assert refused(anonymous.RegisterCustomTool, tool_request("keyed", "tenant-a"))[0] == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert refused(stranger.ListJobs, spb.ListJobsRequest())[0] == grpc.StatusCode.UNAUTHENTICATED
    code, reason = refused(a.RegisterCustomTool, tool_request("keyed", "tenant-b"))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "TENANT_NOT_ALLOWED")
    assert refused(a.RegisterCustomTool, tool_request("keyed", "*"))[0] == (
        grpc.StatusCode.PERMISSION_DENIED  # a tool for every tenant is an admin's to add
    )
    stored = a.RegisterCustomTool(tool_request("keyed"), timeout=30).tool  # the key's tenant
    assert stored.tenant_id == "tenant-a" and stored.status == pb.TOOL_STATUS_DRAFT

    # Reviewing: only for the tool's tenant; another tenant's tool is not even revealed.
    assert refused(b.SetCustomToolStatus, review("keyed", "tenant-a"))[0] == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert refused(b.SetCustomToolStatus, review("keyed"))[0] == grpc.StatusCode.NOT_FOUND
    approved = a.SetCustomToolStatus(review("keyed"), timeout=30).tool
    assert approved.status == pb.TOOL_STATUS_APPROVED
    assert smesh.call("keyed").result.content == "keyed"  # Execute: the registry's own call
    admin.SetCustomToolStatus(
        spb.SetCustomToolStatusRequest(
            name="keyed", tenant_id="tenant-a", status=pb.TOOL_STATUS_REJECTED, reason="no"
        ),
        timeout=30,
    )
    assert smesh.call("keyed").result.envelope.err.err_kind == "tool_not_approved"

    # Jobs: submitted, read and listed only for the key's tenant (an admin's: any).
    engine = make_engine(smesh.database_url)
    with session_factory(engine).begin() as s:
        s.add(
            ToolJobRow(id="keyedjob-a", job_type="build", status="approved", tenant_id="tenant-a")
        )
    engine.dispose()
    submit = spb.SubmitBuildJobRequest(request="x", context=pb.CallContext(tenant_id="tenant-a"))
    assert refused(b.SubmitBuildJob, submit)[0] == grpc.StatusCode.PERMISSION_DENIED
    assert refused(b.GetJob, spb.GetJobRequest(id="keyedjob-a", tenant_id="tenant-a"))[0] == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert refused(b.GetJob, spb.GetJobRequest(id="keyedjob-a"))[0] == grpc.StatusCode.NOT_FOUND
    assert refused(b.ListJobs, spb.ListJobsRequest(tenant_id="tenant-a"))[0] == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert "keyedjob-a" not in [j.id for j in b.ListJobs(spb.ListJobsRequest()).jobs]
    assert a.GetJob(spb.GetJobRequest(id="keyedjob-a"), timeout=30).job.tenant_id == "tenant-a"
    assert "keyedjob-a" in [j.id for j in admin.ListJobs(spb.ListJobsRequest()).jobs]


def test_the_cli_sends_its_api_key_to_a_keyed_sandbox(
    smesh: Mesh,
    keyed_sandbox: ServiceProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOOLMESH_SANDBOX_ADDR", keyed_sandbox.address)
    monkeypatch.setenv("TOOLMESH_REGISTRY_ADDR", smesh.address("registry"))
    code, schema = tmp_path / "keyed_cli.py", tmp_path / "keyed_cli.json"
    code.write_text("result = 'via cli'\n")
    schema.write_text(json.dumps({"type": "object"}))
    add = ["tools", "add", "--code", str(code), "--schema", str(schema)]
    monkeypatch.delenv("TOOLMESH_API_KEY", raising=False)
    assert toolmesh(add) == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    monkeypatch.setenv("TOOLMESH_API_KEY", "sbx-key-b")
    assert toolmesh(add) == 0  # no --tenant: the key's
    assert "for tenant tenant-b" in capsys.readouterr().out
    assert toolmesh(["tools", "approve", "keyed_cli"]) == 0
    assert smesh.call("keyed_cli", tenant="tenant-b").result.content == "via cli"
    assert toolmesh(["jobs", "list"]) == 0
    assert toolmesh(["jobs", "list", "--tenant", "tenant-a"]) == 2
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    monkeypatch.setenv("TOOLMESH_API_KEY", "sbx-key-a")
    assert toolmesh(["tools", "reject", "keyed_cli", "--tenant", "tenant-b"]) == 2
    assert toolmesh(["tools", "reject", "keyed_cli"]) == 2  # tenant-a has no such tool
    assert "NOT_FOUND" in capsys.readouterr().err
    # A system tool is not the sandbox's to review: the CLI goes to the registry for it.
    assert toolmesh(["tools", "approve", "ping"]) == 0
    assert "ping" in capsys.readouterr().out


def test_a_custom_tools_response_cannot_claim_host_files_as_exports(smesh: Mesh) -> None:
    """An export names a file under the service's data dir, which the dispatcher registers for
    download: a custom tool, whose own files never leave its sandbox, could otherwise publish
    any file there — another tenant's upload, the SQLite database — as its own."""
    add(
        smesh,
        "exfiltrate",
        "result = {'message': 'your file', 'exports': "
        "{'people.csv': {'path': 'files/people.csv', 'mime_type': 'text/csv'}}}",
    )
    response = smesh.call("exfiltrate", conversation="exfiltrate")
    assert response.result.envelope.err.err_kind == "bad_result", response.result.content
    assert not response.result.exports
    listed = smesh.dispatcher.ListExports(
        dpb.ListExportsRequest(conversation_id="exfiltrate", tenant_id="tenant-a"), timeout=30
    ).exports
    assert list(listed) == []


def test_recursive_custom_tools_get_a_clear_err_instead_of_stalling_every_slot(
    smesh: Mesh,
) -> None:
    """A custom tool calling itself held a slot at each level while the next level waited for
    one: three such chains (up to 9 levels each) took all 16 slots of the sandbox and waited on
    each other until their wall clocks killed them, stalling every tenant's custom tools. Now
    one tenant's executions take at most TOOLMESH_SANDBOX_TENANT_MAX_CONCURRENT slots, and a
    nested call only its own callers could make room for is refused at once, naming the limit."""
    add(
        smesh,
        "recurse",
        "r = call_tool('recurse', {})\n"
        "result = r['content'] if r['ok'] else 'ERR ' + str(r['error'])",
    )
    results: dict[int, dpb.DispatchToolCallResponse] = {}

    def chain(n: int) -> None:
        results[n] = smesh.call(
            "recurse", conversation=f"recurse-{n}", tool_use_id=f"toolu_recurse_{n}", timeout=120
        )

    threads = [threading.Thread(target=chain, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert sorted(results) == [0, 1, 2]
    for response in results.values():
        assert kind(response) == "ok", response.result.content
        content = response.result.content
        assert "nested call refused: tenant 'tenant-a' runs the 4" in content, content
        assert "TOOLMESH_SANDBOX_TENANT_MAX_CONCURRENT" in content
    after = sandbox(smesh).Execute(
        spb.ExecuteRequest(
            tool_name="q", code="result = 'alive'", context=pb.CallContext(tenant_id="tenant-a")
        ),
        timeout=30,
    )
    assert after.result.content == "alive"
