"""Open access (``access.mode = "open"``, the default) never hands the shell to strangers: through
FakeTelegram and the fake model, a stranger's ``run_shell`` call waits for an admin, the stranger's
own ``/approve`` (typed or pressed) is refused and nothing runs; an admin approves it, or runs the
shell on their own request; with no admin configured a stranger's call is refused at once. And
``gateway doctor`` warns about open access with such tools."""

from __future__ import annotations

import re

from gateway.store.models import ApprovalRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_approvals_e2e import button_press, command, texts
from tests.test_telegram_e2e import dm_update, wait_until

ADMIN, STRANGER, LONER = 5557001, 5557002, 5557003


def shell_then_report(req: dict) -> oa.Reply:
    """Asks for ``run_shell`` (it writes proof.txt in the session workspace), then repeats the
    tool result (without the untrusted-data wrapper)."""
    last = req["messages"][-1]
    if last["role"] == "tool":
        lines = last["content"].splitlines()
        return oa.text("tool said: " + " | ".join(lines[1:-1] if lines[0].startswith("<") else lines))
    return oa.tool_calls(oa.call("run_shell", {"command": "echo ran > proof.txt && echo shell-ran"}))


def config(tmp_path, fake_openai, fake_telegram, admins: list[str]):
    return gateway_config(tmp_path, fake_openai, fake_telegram,
                          access={"mode": "open", "admins": admins},
                          tools={"workspace": "shell", "workspace_root": str(tmp_path / "ws")},
                          approvals={"require_for": ["write", "external"], "timeout_s": 30.0})


def proofs(tmp_path) -> list:
    return list((tmp_path / "ws").rglob("proof.txt"))


async def prompt_of(fake, chat_id: int) -> tuple[str, str]:
    await wait_until(lambda: any("Approval needed" in t for t in texts(fake, chat_id)), what="approval prompt")
    prompt = next(t for t in texts(fake, chat_id) if "Approval needed" in t)
    assert "run_shell" in prompt
    return prompt, re.search(r"/approve (\w+)", prompt).group(1)


async def test_a_stranger_cannot_approve_their_own_shell_call_but_an_admin_can(tmp_path, fake_telegram,
                                                                               fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = shell_then_report
    await start_gateway(config(tmp_path, fake_openai, fake_telegram, [f"telegram:{ADMIN}"]), running)
    fake_telegram.inject(dm_update("run something", 7101, user_id=STRANGER))
    prompt, approval = await prompt_of(fake_telegram, STRANGER)
    assert "only an admin can allow that" in prompt

    fake_telegram.inject(command(f"/approve {approval}", 7102, user_id=STRANGER))  # typed
    await wait_until(lambda: any("Only an admin can approve" in t for t in texts(fake_telegram, STRANGER)),
                     what="typed refusal")
    fake_telegram.inject(button_press(fake_telegram, STRANGER, STRANGER, f"/approve {approval}", "q-own"))  # pressed
    await wait_until(lambda: sum("Only an admin can approve" in t for t in texts(fake_telegram, STRANGER)) == 2,
                     what="pressed refusal")
    assert not proofs(tmp_path)
    assert not any(t.startswith("tool said") for t in texts(fake_telegram, STRANGER))

    fake_telegram.inject(command(f"/approve {approval}", 7103, user_id=ADMIN))  # from the admin's own DM
    await wait_until(lambda: "Approved: running run_shell." in texts(fake_telegram, ADMIN), what="admin approval")
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, STRANGER)), what="reply")
    assert "shell-ran" in texts(fake_telegram, STRANGER)[-1]
    assert [p.read_text() for p in proofs(tmp_path)] == ["ran\n"]


async def test_an_admin_approves_their_own_shell_call(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = shell_then_report
    await start_gateway(config(tmp_path, fake_openai, fake_telegram, [f"telegram:{ADMIN}"]), running)
    fake_telegram.inject(dm_update("run something", 7201, user_id=ADMIN))
    prompt, approval = await prompt_of(fake_telegram, ADMIN)
    assert "Reply /approve" in prompt and "only an admin" not in prompt
    fake_telegram.inject(command(f"/approve {approval}", 7202, user_id=ADMIN))
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, ADMIN)), what="reply")
    assert "shell-ran" in texts(fake_telegram, ADMIN)[-1]
    assert len(proofs(tmp_path)) == 1


async def test_without_an_admin_a_strangers_shell_call_is_refused_at_once(tmp_path, fake_telegram, fake_openai,
                                                                         running):
    fake_openai.reset()
    fake_openai.responder = shell_then_report
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, []), running)
    fake_telegram.inject(dm_update("run something", 7301, user_id=LONER))
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, LONER)), what="reply")
    assert texts(fake_telegram, LONER)[-1].startswith("tool said: Refused: run_shell needs an admin's approval")
    assert not any("Approval needed" in t for t in texts(fake_telegram, LONER))
    with gateway.engine.connect() as conn:
        assert conn.execute(ApprovalRow.__table__.select()).first() is None  # nobody was asked
    assert not proofs(tmp_path)


async def test_doctor_warns_about_open_access_with_the_shell(tmp_path, fake_telegram, fake_openai, capsys):
    from gateway.app.doctor import run_doctor

    await run_doctor(config(tmp_path, fake_openai, fake_telegram, []))
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("[warn] access:"))
    assert 'mode = "open"' in line and "run_shell" in line and "write_file" in line and "refused" in line

    loose = config(tmp_path, fake_openai, fake_telegram, [f"telegram:{ADMIN}"])
    loose.approvals.require_for = []
    await run_doctor(loose)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("[warn] approvals:"))
    assert "ANYONE" in line and "write_file" in line and "run_shell" in line

    strict = config(tmp_path, fake_openai, fake_telegram, [f"telegram:{ADMIN}"])
    strict.access.mode = "allowlist"
    await run_doctor(strict)
    assert "[warn]" not in capsys.readouterr().out
