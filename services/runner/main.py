"""The runner: claims pending turns through the writer and works on several at once.

A claim is a lease: renewed while the turn runs, handed back on SIGTERM, taken by another runner if
this one dies. One session's turns run in order, one at a time (the writer only hands out a
session's oldest unfinished turn). Wake-ups come from the writer's turn events; a poll every second
covers lost events and expired leases.

Every write of the runner (claims, renewals, a turn's steps and its answer) waits out the writer's
condition (a full disk, an I/O error, a busy or restarting writer: common/holding.py) and is sent
again under the same idempotency key: none of them is a reason to drop a turn or to exit.
"""

from __future__ import annotations

import asyncio
import sys

import structlog

from common import bus, db, holding, sandbox
from common.errors import StarlingError, WriteRejected
from common.redact import redact_struct
from common.runtime import Runtime
from common.service import boot
from schema import messages as m
from services.runner.persona import Persona, Personas

# The model providers (aiohttp's client) and the tools are imported on the first turn, not at start:
# an idle runner starts faster and stays smaller (see bench/startup.py).

POLL_S = 1.0


class Runner:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.svc = rt.svc
        self.cfg = rt.svc.cfg
        self.paths = rt.svc.paths
        self.log = rt.log
        self.worker = rt.identity.worker  # <name>@<host>/<boot>: a restart under the name takes these turns back
        self.personas = Personas(self.paths.agents_dir)
        self.providers: dict[tuple[str, str], object] = {}
        self.reader = None
        self.active: dict[int, asyncio.Task] = {}
        self.alone_turn: int | None = None  # a turn whose runner died holding it: nothing runs beside it
        self.drain = False  # such a turn waits for a runner holding nothing: claim no more until ours are done
        self.slots = asyncio.Semaphore(self.cfg.runner.turns_per_process)
        self.lease_s = self.cfg.runner.lease_s

    async def call(self, op: m.WriteOp):
        # Every write of a turn and its tools passes here: what is stored (turns, so the FTS index too,
        # tool results, audit arguments, approvals, outbox) holds no secret value the runner knows.
        # Held while the writer's condition lasts; raises only a refusal (lease_lost, ...).
        return await holding.call(self.rt.client, redact_struct(op), log=self.log)

    # ------------------------------------------------------------ models

    def provider_for(self, persona: Persona):
        from services.runner.providers.base import make_provider
        from services.runner.turn import settings_model

        name = persona.settings.provider
        cfg = self.cfg.providers.get(name)
        if cfg is None:
            raise StarlingError(f"agent {persona.agent!r} uses provider {name!r}, which config.toml does not define"
                                f" (add [providers.{name}])")
        cfg = settings_model(persona, cfg)
        key = (name, cfg.model)
        if key not in self.providers:
            self.providers[key] = make_provider(name, cfg, self.paths.secrets_file, log=self.log)
        return self.providers[key]

    def describe_model(self, agent: str) -> str:
        try:
            provider = self.provider_for(self.personas.get(agent))
        except StarlingError as exc:
            return f"unavailable ({exc})"
        return f"{provider.name} / {provider.model}"

    def context_window(self, persona: Persona) -> int:
        return self.cfg.providers[persona.settings.provider].context_window

    def _log_sandbox(self) -> None:
        """Name the confinement layers in force at every start (and warn loudly when there are none)."""
        found = sandbox.probe(self.cfg.tools.sandbox)
        if found.mode == sandbox.NO_SANDBOX:
            self.log.warning("sandbox_off", layers=found.layers(),
                             reason="[tools] sandbox = \"none\": shell commands and jobs run unconfined")
        elif found.confined:
            self.log.info("sandbox", layers=found.layers(), **({"missing": found.reason} if found.reason else {}))
        else:
            self.log.warning("sandbox_unavailable", reason=found.off_reason())

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        self._log_sandbox()
        self.reader = await asyncio.to_thread(db.wait_for_schema, self.paths.db_file, 60.0,
                                                stop=self.svc.stopping)
        events = bus.EventSubscriber(self.svc.endpoints.events, self.svc.key, [m.TOPIC_TURN])
        events.start()
        await self.rt.announce_ready()
        if self.rt.enlisted is not None and self.rt.enlisted.poisoned:
            self.log.error("turns_poisoned", turns=self.rt.enlisted.poisoned,
                           detail="each crashed the runner holding it, time after time: failed, the person told")
        try:
            while True:
                await self._claim_what_we_can()
                await events.drain(POLL_S)  # events, a resync or a timeout: look again either way
        finally:
            events.close()
            await self._hand_back()
            for provider in self.providers.values():
                await provider.close()
            mcp = sys.modules.get("services.runner.tools.mcp")  # imported with the tools, on the first turn
            if mcp is not None:
                await mcp.close_all()  # the MCP servers this runner started stop with it

    async def _claim_what_we_can(self) -> None:
        while not self.slots.locked() and self.alone_turn is None:
            if self.drain and self.active:
                return  # ours finish first; then this runner claims alone and may take the waiting turn
            result = await self.call(m.ClaimTurn(worker=self.worker, lease_s=self.lease_s, alone=not self.active,
                                                 alert_to=self.cfg.health.alert_to))
            self.drain = result.alone_waiting
            if not isinstance(result, m.TurnClaim):
                return
            if result.alone:
                self.alone_turn = result.turn_id
                self.log.warning("turn_alone", turn_id=result.turn_id, attempt=result.attempt,
                                 detail="a runner died holding this turn: it runs with nothing beside it")
            await self.slots.acquire()
            self.active[result.turn_id] = asyncio.create_task(self._work(result))

    async def _work(self, claim: m.TurnClaim) -> None:
        from services.runner.turn import TurnWork, cancel_quietly

        log = self.log.bind(session_id=claim.session_id, turn_id=claim.turn_id, agent=claim.agent,
                            attempt=claim.attempt)
        structlog.contextvars.bind_contextvars(session_id=claim.session_id, turn_id=claim.turn_id)
        renewer = asyncio.create_task(self._renew(claim, log))
        try:
            log.info("turn_claimed", instance=claim.instance, chat=claim.chat)
            await TurnWork(self, claim, log).run()
        except asyncio.CancelledError:
            raise
        except WriteRejected as exc:
            log.warning("turn_abandoned", code=exc.code, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - one turn's bug must not take the runner down
            log.exception("turn_crashed", error=str(exc))
            await self._give_up(claim, exc)
        finally:
            await cancel_quietly(renewer)
            self.active.pop(claim.turn_id, None)
            if self.alone_turn == claim.turn_id:
                self.alone_turn = None
            self.slots.release()

    async def _give_up(self, claim: m.TurnClaim, exc: Exception) -> None:
        from services.runner.turn import WENT_WRONG

        try:
            await self.call(m.FinishTurn(turn_id=claim.turn_id, worker=self.worker, ok=False,
                                         error=f"{type(exc).__name__}: {exc}"[:500],
                                         answer="", replies=[m.Reply(text=WENT_WRONG)]))
        except StarlingError:
            pass

    async def _renew(self, claim: m.TurnClaim, log) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.call(m.RenewLease(kind="turn", id=claim.turn_id, worker=self.worker, lease_s=self.lease_s))
            except WriteRejected:
                log.warning("lease_lost_while_working")
                task = self.active.get(claim.turn_id)
                if task is not None:
                    task.cancel()  # another runner has it now: stop, its answer counts
                return

    async def _hand_back(self) -> None:
        """On stop: cancel turns in flight and release their claims so another runner takes them now."""
        claims = list(self.active)
        for task in list(self.active.values()):
            task.cancel()
        await asyncio.gather(*self.active.values(), return_exceptions=True)
        for turn_id in claims:
            try:
                await asyncio.wait_for(self.call(m.ReleaseTurn(turn_id=turn_id, worker=self.worker)), 2)
            except (asyncio.TimeoutError, StarlingError):
                pass  # the lease will expire instead
        if claims:
            self.log.info("handed_back", turns=claims)


async def serve(rt: Runtime) -> None:
    await Runner(rt).run()


def main(argv: list[str] | None = None) -> int:
    svc = boot("runner", argv, description="Starling's agent runner")
    return asyncio.run(Runtime(svc).run(serve, announces_ready=True))


if __name__ == "__main__":
    sys.exit(main())
