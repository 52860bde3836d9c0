"""End to end as a user does it: ``interlock dev``, ``interlock apply`` of a workflow and a
``kind: Webhook``, then ``curl`` posts a GitHub-style signed ``pull_request`` webhook and
the workflow runs to completion (read back with ``curl`` too); a signed signal moves a
waiting run. The gateway runs on its own credentials (role ``gateway``)."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support.gateway import yaml
from support.runtime import STARTUP_TIMEOUT, cli_env, interlock_bg, run_cli

SECRET = "e2e webhook secret"

MANIFESTS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: pr-review
    spec:
      inputs:
        title: {type: string, required: true}
        url: {type: string, required: true}
      triggers:
        - event: com.github.pull_request
          filter: {action: opened}
          input: {title: "{{ data.pull_request.title }}", url: "{{ data.pull_request.html_url }}"}
      initial_state: review
      states:
        review:
          actions:
            - capability: echo
              input: {message: "review {{ inputs.title }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            reviewed: "$.states.review.output.message"
            url: "{{ inputs.url }}"
    ---
    apiVersion: interlock.io/v1
    kind: Webhook
    metadata:
      name: github
    spec:
      scheme: github
      secret: {env: GITHUB_WEBHOOK_SECRET}
      source: https://github.com/acme/payments
      type: {header: X-GitHub-Event, prefix: com.github., values: [pull_request, push]}
      subject: {field: pull_request.html_url}
      signals: {prefix: com.github.}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: merge-gate
    spec:
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: com.github.approved, goto: merged}
        merged:
          type: terminal
    """
)


def curl(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        ["curl", "-sS", "-w", "\n%{http_code}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed (apt install curl)")
def test_curl_posts_a_signed_pull_request_and_the_workflow_completes(tmp_path: Path) -> None:
    data_dir = tmp_path / ".interlock"
    env = cli_env("", "il", GITHUB_WEBHOOK_SECRET=SECRET)
    dev = interlock_bg(
        "dev",
        "--port",
        "0",
        "--http-port",
        "0",
        "--data-dir",
        str(data_dir),
        env=env,
        cwd=tmp_path,
    )
    try:
        nats = dev.wait_for(r"export INTERLOCK_URL=(\S+)", STARTUP_TIMEOUT).group(1)
        http = dev.wait_for(r"export INTERLOCK_HTTP=(\S+)", STARTUP_TIMEOUT).group(1)
        dev.wait_for("orchestrator running", STARTUP_TIMEOUT)
        token = (data_dir / "creds" / "http-operator.token").read_text().strip()
        (tmp_path / "review.yaml").write_text(MANIFESTS)
        applied = run_cli("apply", "review.yaml", env=cli_env(nats, "il"), cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr
        assert "webhook default/github" in applied.stdout

        body = json.dumps(
            {
                "action": "opened",
                "number": 7,
                "pull_request": {
                    "title": "Fix the rounding",
                    "html_url": "https://github.com/acme/payments/pull/7",
                },
            }
        )
        digest = hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()
        delivery = ["-H", "X-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958"]
        common = [
            f"{http}/webhooks/github",
            "-H",
            "Content-Type: application/json",
            "-H",
            "X-GitHub-Event: pull_request",
            *delivery,
            "--data-binary",
            body,
        ]
        status, text = curl(*common, "-H", "X-Hub-Signature-256: sha256=" + "0" * 64)
        assert status == 401, text
        status, first = curl(*common, "-H", f"X-Hub-Signature-256: sha256={digest}")
        assert status == 202, first
        [event] = json.loads(first)["events"]
        [run] = event["started"]
        assert run["workflow"] == "pr-review"

        status, text = curl(
            f"{http}/runs/{run['run_id']}/result?timeout=30",
            "-H",
            f"Authorization: Bearer {token}",
        )
        assert status == 200, text
        result = json.loads(text)
        assert result["status"] == "completed", result
        assert result["outputs"] == {
            "reviewed": "review Fix the rounding",
            "url": "https://github.com/acme/payments/pull/7",
        }
        # GitHub redelivers with the same delivery id: the first answer, no second run.
        status, again = curl(*common, "-H", f"X-Hub-Signature-256: sha256={digest}")
        assert status == 202
        assert json.loads(again) == json.loads(first)
        listed: list[object] = []
        for _ in range(300):  # the run index is written just after the run's log
            runs = run_cli("runs", "--json", env=cli_env(nats, "il"), cwd=tmp_path)
            listed = json.loads(runs.stdout)
            if listed:
                break
            time.sleep(0.1)
        assert len(listed) == 1, listed

        # A signed signal to one run: the gateway (on its own credentials, role gateway)
        # publishes it on the run's subject, which no publisher may.
        assert (data_dir / "creds" / "gateway.creds").is_file()
        started = run_cli(
            "start", "merge-gate", "--run-id", "gate-1", env=cli_env(nats, "il"), cwd=tmp_path
        )
        assert started.returncode == 0, started.stderr
        approval = json.dumps({"run_id": "gate-1", "signal": "approved", "by": "ana"})
        signed = hmac.new(SECRET.encode(), approval.encode(), hashlib.sha256).hexdigest()
        status, text = curl(
            f"{http}/webhooks/github/runs/gate-1/signals/approved",
            "-H",
            "Content-Type: application/json",
            "-H",
            "X-GitHub-Delivery: 0b8c1f0e-cc79-11e3-81ab-4c9367dc0958",
            "-H",
            f"X-Hub-Signature-256: sha256={signed}",
            "--data-binary",
            approval,
        )
        assert status == 202, text
        status, text = curl(
            f"{http}/runs/gate-1/result?timeout=30", "-H", f"Authorization: Bearer {token}"
        )
        assert json.loads(text)["status"] == "completed", text
    finally:
        dev.signal(signal.SIGINT)
        code = dev.wait(30)
    assert code == 0, dev.output
