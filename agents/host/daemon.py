"""The agent loop: register once, then heartbeat -> desired state -> reconcile, forever.

One iteration::

    observe  runtime.list()                       (None if the runtime cannot be listed)
    sample   backend.sample()                     ([] if the backend fails)
    report   POST /agent/v1/heartbeat             (observed + remembered exits + missing)
    decide   reconcile(desired, observed)         (pure; see reconcile.py)
             + checkpoint_actions(...)            (a job under notice: signal, grace, stop)
    act      Stop / Remove / Start / Signal       (each failure logged, never fatal)

Failure policy: the control plane unreachable (refused, timeout, 5xx, 429) -> containers
keep running untouched and the agent retries after ``backoff(attempt)``. 401/403 on a
heartbeat -> the saved host token is dropped and the agent registers again (if it still
has a bootstrap token), presenting the dropped token as ``previous_host_token``, else keeps
retrying. One failing probe or runtime call never
ends the loop. SIGTERM/SIGINT -> the current iteration finishes, the loop exits 0 and
containers are left running (the agent may be restarted or upgraded under them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from agents.host import __version__
from agents.host.client import (
    ControlPlaneClient,
    ControlPlaneError,
    MoveClient,
    Rejected,
    Unauthorized,
)
from agents.host.config import AgentConfig
from agents.host.gpu import GpuBackend
from agents.host.reconcile import (
    Action,
    Remove,
    ReportExit,
    Signal,
    Start,
    StartFailure,
    Stop,
    checkpoint_actions,
    checkpoint_due_in,
    reconcile,
    start_failed,
    start_held,
)
from agents.host.runtime import Runtime
from agents.host.state import (
    HostState,
    clear_registration_nonce,
    clear_state,
    load_state,
    registration_nonce,
    save_state,
)
from agents.protocol import (
    DEFAULT_START_ATTEMPTS,
    FINAL_TAIL_LINES,
    HEARTBEAT_LOGS_MAX_BYTES,
    ContainerLogTail,
    DesiredContainer,
    GpuInfo,
    GpuSample,
    Heartbeat,
    HeartbeatResponse,
    LogsRequest,
    ObservedContainer,
    RegisterRequest,
    RegisterResponse,
    VolumeMoveOrder,
    VolumeUsage,
    WaitRequest,
    clip_log,
    json_size,
)

logger = logging.getLogger(__name__)

# How often the agent measures its volumes' usage for the control plane (docs/volumes.md):
# measuring walks their files (`docker system df`), so not every heartbeat.
VOLUME_USAGE_EVERY_S = 60.0
# A long poll the control plane answered at once without parking it (no slot free) is tried
# again after this, doubling (jittered) up to the cap: soon, not at the next heartbeat.
POLL_RETRY_BASE_S = 0.25
POLL_RETRY_CAP_S = 2.0
# A volume move's data goes up in pieces of this size (the control plane's limit per request).
MOVE_CHUNK_BYTES = 1024 * 1024


def send_volume(runtime: object, client: MoveClient, volume: str) -> None:
    """The source: a tar of the volume, up in CHUNK_BYTES pieces, then its size and SHA-256."""
    export: Callable[[str], Iterable[bytes]] | None = getattr(runtime, "volume_export", None)
    if export is None:
        raise RuntimeError(f"the {getattr(runtime, 'name', '?')} runtime cannot move volumes")
    digest, size, seq, buf = hashlib.sha256(), 0, 0, bytearray()
    for piece in export(volume):
        buf += piece
        while len(buf) >= MOVE_CHUNK_BYTES:
            chunk = bytes(buf[:MOVE_CHUNK_BYTES])
            del buf[:MOVE_CHUNK_BYTES]
            client.put_chunk(seq, chunk)
            digest.update(chunk)
            size, seq = size + len(chunk), seq + 1
    if buf or seq == 0:
        client.put_chunk(seq, bytes(buf))
        digest.update(buf)
        size, seq = size + len(buf), seq + 1
    client.report("sent", {"size_bytes": size, "sha256": digest.hexdigest(), "chunks": seq})


def receive_volume(runtime: object, client: MoveClient, order: VolumeMoveOrder) -> None:
    """The target: the chunks down into a temporary file, checked against the size and
    SHA-256 the source sent (nothing is unpacked otherwise), unpacked into a new volume, then
    reported. A copy the control plane does not accept is removed again."""
    volume = order.volume
    unpack: Callable[[str, str, object], None] | None = getattr(runtime, "volume_import", None)
    if unpack is None:
        raise RuntimeError(f"the {getattr(runtime, 'name', '?')} runtime cannot move volumes")
    digest, size, seq = hashlib.sha256(), 0, 0
    with tempfile.TemporaryFile(prefix="gpucloud-move-") as f:
        while True:
            try:
                chunk = client.get_chunk(seq)
            except Rejected as e:
                if "unknown_chunk" in str(e) and seq > 0:
                    break  # past the last one
                raise
            f.write(chunk)
            digest.update(chunk)
            size, seq = size + len(chunk), seq + 1
        if (size, digest.hexdigest()) != (order.size_bytes, order.sha256):
            raise RuntimeError(f"received {size} bytes with sha256 {digest.hexdigest()[:12]}, the source sent "
                               f"{order.size_bytes} bytes with sha256 {order.sha256[:12]}: nothing unpacked")
        f.seek(0)
        unpack(volume, order.tenant_id, f)
    state = client.report("received", {"size_bytes": size, "sha256": digest.hexdigest()})
    if state != "done":
        remove: Callable[[str], bool] | None = getattr(runtime, "remove_volume", None)
        if remove is not None:
            remove(volume)
        logger.error("volume copy not accepted; removed", extra={"volume": volume, "state": state})


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry ``attempt`` (0 = first retry).

    Exponential (``base * 2**attempt``) up to ``cap``, with "equal jitter": half the
    delay is fixed, half random, so a fleet of agents that lost the control plane at the
    same moment does not come back in lock-step, yet none retries in a tight loop.
    """
    ceiling = min(cap, base * 2.0 ** min(max(attempt, 0), 62))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def starts_first(
    actions: list[Action], desired: Iterable[DesiredContainer], *, defer: bool
) -> list[Action]:
    """``actions`` with the removal of containers nobody wants (exited, or stopped strays)
    after the starts, or with ``defer`` left out altogether, when there is a start among them
    (pure). A removal takes the engine a while (a Docker delete, 0.1-0.3 s), and the start,
    and the report of it, are what a user waits for: the next iteration, at once after a
    start, reports it first and removes them then. A removal that a start needs (a stale
    container of the same instance) stays before it."""
    if not any(isinstance(a, Start) for a in actions):
        return actions
    wanted = {d.instance_id for d in desired}
    now: list[Action] = []
    later: list[Action] = []
    for a in actions:
        (later if isinstance(a, Remove) and a.instance_id not in wanted else now).append(a)
    return now if defer else now + later


def merge_exits(
    observed: list[ObservedContainer], remembered_exits: dict[str, ObservedContainer]
) -> list[ObservedContainer]:
    """Observed containers plus remembered exits of containers that have since vanished,
    so an exit code is never lost and a finished job is never started again."""
    seen = {o.instance_id for o in observed}
    return observed + [o for iid, o in sorted(remembered_exits.items()) if iid not in seen]


def build_report(
    view: list[ObservedContainer],
    desired: Iterable[DesiredContainer],
    failures: Mapping[str, StartFailure],
    notes: Mapping[str, str] | None = None,
    restarts: Mapping[str, int] | None = None,
) -> list[ObservedContainer]:
    """What the heartbeat says about containers (pure): the view, plus ``missing`` for
    desired instances with no container (or only the ``created`` leftover of a failed start),
    with the last start error and the failed starts in a row if there were any. ``notes``:
    what the agent saw that the owner should read (a container lost or restarted without its
    order, a stand-in image), on the desired instance's report; ``restarts``: the restarts
    it saw of a running one."""
    notes, restarts = notes or {}, restarts or {}
    wanted = {d.instance_id for d in desired}
    report = []
    for o in view:
        f = failures.get(o.instance_id)
        if o.instance_id in wanted and o.state == "created" and f is not None:
            continue  # a failed start's leftover: reported as missing, with its error, below
        note = notes.get(o.instance_id) if o.instance_id in wanted and o.state != "exited" else None
        n = restarts.get(o.instance_id, 0) if o.state == "running" else 0
        report.append(replace(o, note=note, restarts=n) if note or n else o)
    seen = {o.instance_id for o in report}
    for d in desired:
        if d.instance_id not in seen:
            f = failures.get(d.instance_id)
            report.append(
                ObservedContainer(
                    instance_id=d.instance_id,
                    state="missing",
                    error=f.error if f else None,
                    start_attempts=f.attempts if f else 0,
                    note=None if f else notes.get(d.instance_id),
                )
            )
    return report


class Client(Protocol):
    def register(self, req: RegisterRequest) -> RegisterResponse: ...

    def heartbeat(self, token: str, hb: Heartbeat) -> HeartbeatResponse: ...


def host_resources() -> tuple[int, int]:
    """(CPU count, memory MiB) of this machine."""
    cpus = os.cpu_count() or 1
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return cpus, int(line.split()[1]) // 1024
    except OSError:
        pass
    return cpus, int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // (1024 * 1024)


class Agent:
    """One host's agent. No globals: many can run in one process (simulated fleets)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        backend: GpuBackend,
        runtime: Runtime,
        client: Client | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        resources: tuple[int, int] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.runtime = runtime
        self.client: Client = client or ControlPlaneClient(
            config.server, timeout_s=config.request_timeout_s
        )
        self.rng = rng or random.Random()
        self.clock = clock
        self.resources = resources or host_resources()
        self.state: HostState | None = load_state(config.state_dir, config.server)
        # The last host token this process held after it was dropped (a 401): sent as
        # `previous_host_token` when registering again, the proof that this machine is the
        # host of that name (the control plane refuses a known name without one).
        self._previous_token: str | None = None
        self.interval_s = config.default_interval_s
        self.failures = 0  # consecutive iterations that did not reach the control plane
        self.seq = 0
        self._volumes_measured_at = float("-inf")
        # volume moves under way in this process (move id -> its thread): one each
        self.moves: dict[str, threading.Thread] = {}
        self.desired: list[DesiredContainer] = []
        self.last_ok = False
        self._inventory: list[GpuInfo] | None = None
        self._exits: dict[str, ObservedContainer] = {}
        self._exit_logged: set[str] = set()
        # instance ids the control plane asked this process to run, while their containers
        # exist: a running container outside it is a stray, removed in one pass
        self._known: set[str] = set()
        # Failed starts in a row per desired instance (reconcile.StartFailure): backed off,
        # given up at the control plane's bound, reported with the runtime's message.
        self._start_failures: dict[str, StartFailure] = {}
        self.start_attempts = DEFAULT_START_ATTEMPTS  # the bound, from each heartbeat answer
        # Containers of desired work as last seen (instance id -> (container id, started at)):
        # one that is gone, restarted or replaced without this agent's order is reported
        # (`_notes`, `_restarts`) to the control plane, which records a container event.
        self._containers: dict[str, tuple[str, str | None]] = {}
        self._notes: dict[str, str] = {}
        self._restarts: dict[str, int] = {}
        # Log tails the control plane asked for; sent with the next heartbeat that gets through.
        self._log_requests: list[LogsRequest] = []
        # Containers seen exited whose last output has not reached the control plane yet,
        # and those whose has (while the container exists).
        self._final_tails: set[str] = set()
        self._tailed: set[str] = set()
        # Tails in a heartbeat the control plane refused (a 4xx that repeats as is): sent
        # empty instead, so no log text can keep the host from reporting (and going DOWN).
        self._refused_tails: set[str] = set()
        self._stop = threading.Event()
        # Set by a tunnel WAKE or a long poll (the desired state changed) or a stop: ends the
        # wait early.
        self._wake = threading.Event()
        # The long poll (protocol WaitRequest): the desired_version of the last heartbeat
        # answer, and how many answers carried one (each allows one poll).
        self._poll_cond = threading.Condition()
        self._desired_version: str | None = None
        self._answers = 0
        self._beating = False  # a heartbeat is in flight (its answer starts the next poll)
        self._acted = False  # the last iteration started or stopped a container
        self._removals_deferred = False  # the last iteration left removals for this one
        # checkpoint-aware preemption: instance id -> when (self.clock) its signal was sent;
        # it is stopped checkpoint_grace_s later if the control plane still wants it
        self._signalled: dict[str, float] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the loop to exit after the current iteration (safe from a signal handler)."""
        self._stop.set()
        self._wake.set()
        if self._poll_cond.acquire(blocking=False):  # a signal handler must not block on it
            try:
                self._poll_cond.notify_all()
            finally:
                self._poll_cond.release()

    def wake(self) -> None:
        """Heartbeat now instead of at the next interval (safe from any thread)."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Loop until ``request_stop()`` (or one iteration with ``--once``); the exit code."""
        logger.info(
            "agent starting",
            extra={
                "server": self.config.server,
                "hostname": self.config.hostname,
                "version": __version__,
            },
        )
        if not self.config.once and callable(getattr(self.client, "wait", None)):
            threading.Thread(
                target=self._poll_loop, name=f"longpoll-{self.config.hostname}", daemon=True
            ).start()
        try:
            while not self._stop.is_set():
                delay = self.iterate()
                if self.config.once:
                    return 0 if self.last_ok else 1
                self._wake.wait(self._next_wait(delay))  # early on stop or wake
                self._wake.clear()
        finally:
            try:
                self.backend.close()
            except Exception:
                logger.exception("gpu backend close failed")
        logger.info("agent stopped; containers left running", extra={"host_id": self.host_id})
        return 0

    @property
    def host_id(self) -> str | None:
        return self.state.host_id if self.state else None

    def _next_wait(self, delay: float) -> float:
        """The wait before the next heartbeat: ``delay`` +-10 % (agents started together do
        not stay in lock-step), but at once after starting or stopping containers (report
        their new states now), and no later than the runtime's next change it can foresee
        (a simulated job's end), so the control plane does not keep GPUs booked for work
        that is no longer running."""
        if not self.last_ok:
            return delay  # a backoff: jittered already
        if self._acted:
            return 0.0
        wait = delay * self.rng.uniform(0.9, 1.1)
        grace = checkpoint_due_in(self.desired, self._signalled, self.clock())
        if grace is not None:
            wait = min(wait, grace + 0.01)  # stop it when its grace runs out, not later
        foresee = getattr(self.runtime, "next_change_in", None)
        if callable(foresee):
            try:
                ahead = foresee()
            except Exception:
                ahead = None
            if ahead is not None:
                wait = min(wait, max(0.0, float(ahead)) + 0.01)
        return wait

    # --- the long poll --------------------------------------------------------------------

    def _poll_loop(self) -> None:
        """Keep one long poll outstanding for the version of the latest heartbeat answer that
        carried a ``desired_version``: it returns when the desired state moves past that
        version (then heartbeat at once) or after about an interval. A placement never waits
        for the next regular heartbeat, so this loop never lets a poll lapse for one:

        * timed out (parked its whole time, nothing changed): poll again at once, for the
          newest answer's version;
        * answered unchanged before half its time (the server parked nothing: no slot free,
          its listener down): poll again after a short jittered backoff (``POLL_RETRY_BASE_S``
          doubling, at most ``POLL_RETRY_CAP_S``), so it neither spins nor waits out an
          interval; failed (unreachable, 5xx): the same from twice the base, up to an interval
          (a control plane that is down is not asked more often than it is heartbeated). A
          new answer ends either pause;
        * changed: heartbeat now, unless an answer read after the change is here or on its
          way; the poll for that answer's version follows it (and returns at once if the
          answer missed the change).

        Refused (a 4xx other than 401/403: a control plane without long polls) ends the loop:
        the agent then waits out its interval, as before long polls.
        """
        polled = 0  # the answers counted when the current version was taken
        version: str | None = None
        again = False  # poll `version` again without waiting for a new answer
        retries = 0  # polls in a row that ended early or failed
        while True:
            with self._poll_cond:
                while not again and self._answers == polled and not self._stop.is_set():
                    self._poll_cond.wait(timeout=60.0)
                if self._stop.is_set():
                    return
                if self._answers != polled:  # a newer answer: poll for its version
                    polled, version = self._answers, self._desired_version
                state, interval = self.state, self.interval_s
            again = False
            if version is None or state is None:
                continue
            timeout_s = min(max(1.0, interval), 60.0)
            t0 = self.clock()
            try:
                resp = self.client.wait(  # type: ignore[attr-defined]
                    state.host_token, WaitRequest(state.host_id, version, timeout_s=timeout_s)
                )
            except Rejected as e:
                logger.warning(
                    "long poll refused; waiting out the interval instead",
                    extra={"host_id": state.host_id, "error": str(e)},
                )
                return
            except ControlPlaneError as e:
                delay = backoff(retries, POLL_RETRY_BASE_S * 2, max(POLL_RETRY_CAP_S, timeout_s), self.rng)
                retries += 1
                logger.debug(
                    "long poll failed",
                    extra={"host_id": state.host_id, "error": str(e), "retry_in_s": round(delay, 2)},
                )
                again = not self._poll_pause(delay, polled)
                continue
            took = self.clock() - t0
            logger.debug(
                "long poll answered",
                extra={"host_id": state.host_id, "version": version, "changed": resp.changed,
                       "took_ms": round(took * 1000)},
            )
            if resp.changed:
                retries = 0
                if not self._answer_coming(version):
                    self.wake()
            elif took >= timeout_s / 2:
                retries, again = 0, True  # parked and timed out: at once, for the newest version
            else:
                # not parked (the server had no slot for it): soon, not at the next heartbeat
                delay = backoff(retries, POLL_RETRY_BASE_S, POLL_RETRY_CAP_S, self.rng)
                retries += 1
                again = not self._poll_pause(delay, polled)

    def _poll_pause(self, delay: float, polled: int) -> bool:
        """Wait up to ``delay`` seconds; True if a new answer (or a stop) ended it early."""
        deadline = time.monotonic() + delay
        with self._poll_cond:
            while self._answers == polled and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._poll_cond.wait(timeout=left)
        return True

    def _answer_coming(self, version: str) -> bool:
        """Whether the change that ended the poll for ``version`` is, or will be, in a
        heartbeat answer without another heartbeat: one came since the poll began, or one is
        in flight. Most often the change was this host's own report (a container running, a
        job done), published before that report's answer is even sent. Whatever that answer
        missed, the poll for its version (next in the loop) returns at once."""
        with self._poll_cond:
            return self._beating or (self._desired_version is not None and self._desired_version != version)

    def _answered(self, version: str | None) -> None:
        with self._poll_cond:
            self._desired_version = version
            if version is not None:
                self._answers += 1
                self._poll_cond.notify_all()

    # --- one iteration ------------------------------------------------------------------

    def iterate(self) -> float:
        """One pass; returns the seconds to wait before the next. Never raises."""
        started = self.clock()
        try:
            return self._iterate(started)
        except Exception:
            # A bug, not a condition we planned for: log it and keep the host alive.
            logger.exception("iteration failed", extra={"host_id": self.host_id})
            return self._retry_delay()

    def _volume_usage(self, now: float) -> list[VolumeUsage] | None:
        """The runtime's volumes and their bytes, every VOLUME_USAGE_EVERY_S (None between:
        the control plane then infers nothing); None too for a runtime without volumes."""
        measure: Callable[[], dict[str, int]] | None = getattr(self.runtime, "volume_usage", None)
        if measure is None or now - self._volumes_measured_at < VOLUME_USAGE_EVERY_S:
            return None
        try:
            usage = measure()
        except Exception as e:  # noqa: BLE001 - a measurement may fail; the next one retries
            logger.warning("volume usage not measured", extra={"error": str(e)})
            return None
        self._volumes_measured_at = now
        return [VolumeUsage(volume=k, used_bytes=v) for k, v in sorted(usage.items())]

    def _remove_volumes(self, names: list[str]) -> None:
        """Volumes their owners deleted (past the purge grace): gone with their data. The
        runtime refuses one still in use; it is asked again with the next answer."""
        remove: Callable[[str], bool] | None = getattr(self.runtime, "remove_volume", None)
        if remove is None or not names:
            return
        for name in names:
            try:
                if remove(name):
                    logger.info("volume removed", extra={"volume": name})
            except Exception as e:  # noqa: BLE001 - asked again with the next answer
                logger.warning("volume not removed", extra={"volume": name, "error": str(e)})
        self._volumes_measured_at = float("-inf")  # report the set without it at once

    def _start_moves(self, orders: list[VolumeMoveOrder]) -> None:
        """Each move order not under way gets a thread (heartbeats go on meanwhile); an order
        repeated while its thread runs is the same move, left alone."""
        for order in orders:
            t = self.moves.get(order.move_id)
            if t is not None and t.is_alive():
                continue
            if self.state is None:
                return
            t = threading.Thread(target=self._move, args=(order, self.state), daemon=True,
                                 name=f"volume-move-{order.move_id[:8]}")
            self.moves[order.move_id] = t
            t.start()

    def _move(self, order: VolumeMoveOrder, state: HostState) -> None:
        client = MoveClient(state.server, state.host_token, order.move_id)
        try:
            if order.role == "send":
                send_volume(self.runtime, client, order.volume)
            else:
                receive_volume(self.runtime, client, order)
            logger.info("volume move done", extra={"volume": order.volume, "role": order.role})
        except ControlPlaneError as e:
            # the control plane is unreachable: the order comes again with a later answer
            logger.warning("volume move interrupted", extra={"volume": order.volume, "error": str(e)})
        except Exception as e:  # noqa: BLE001 - the runtime failed: the move fails, the volume stays
            logger.error("volume move failed", extra={"volume": order.volume, "error": str(e)})
            remove: Callable[[str], bool] | None = getattr(self.runtime, "remove_volume", None)
            if order.role == "receive" and remove is not None:
                remove(order.volume)  # no half copy stays behind
            try:
                client.report("failed", {"error": f"{order.role}: {e}"[:400]})
            except ControlPlaneError:
                pass
        self._volumes_measured_at = float("-inf")  # report the volumes as they are now

    def _retry_delay(self) -> float:
        self.last_ok = False
        delay = backoff(
            self.failures, self.config.backoff_base_s, self.config.backoff_cap_s, self.rng
        )
        self.failures += 1
        return delay

    def _iterate(self, started: float) -> float:
        hb: Heartbeat | None = None
        try:
            if self.state is None:
                self._register()
            assert self.state is not None
            observed = self._observe()
            view = [] if observed is None else merge_exits(observed, self._exits)
            report = (
                None if observed is None else build_report(
                    view, self.desired, self._start_failures, self._notes_now(), self._restarts)
            )
            self.seq += 1
            hb = Heartbeat(
                host_id=self.state.host_id,
                seq=self.seq,
                gpus=self._sample(),
                containers=report,
                agent_version=__version__,
                logs=self._logs(),
                volumes=self._volume_usage(started),
            )
            with self._poll_cond:
                self._beating = True
            try:
                resp = self.client.heartbeat(self.state.host_token, hb)
            finally:
                with self._poll_cond:
                    self._beating = False
        except Unauthorized as e:
            if self.state is not None:
                logger.error(
                    "host token refused; will register again",
                    extra={"host_id": self.state.host_id, "error": str(e)},
                )
                self._previous_token = self.state.host_token
                self.state = None
                clear_state(self.config.state_dir)
            else:
                logger.error("registration refused", extra={"error": str(e)})
            return self._log_retry(e)
        except Rejected as e:
            if hb is not None and any(t.text for t in hb.logs):
                self._refused_tails |= {t.instance_id for t in hb.logs if t.text}
                logger.error(
                    "heartbeat refused; the next one sends its log tails empty",
                    extra={"host_id": self.host_id, "error": str(e)},
                )
            return self._log_retry(e)
        except ControlPlaneError as e:
            return self._log_retry(e)

        self.failures, self.last_ok = 0, True
        self.interval_s = resp.heartbeat_interval_s
        if resp.host_token and resp.host_token != self.state.host_token:
            self.state = HostState(self.state.server, self.state.host_id, resp.host_token)
            save_state(self.config.state_dir, self.state)
            logger.info("host token rotated", extra={"host_id": self.state.host_id})
        self.desired = resp.desired
        self.start_attempts = resp.start_attempts
        self._answered(resp.desired_version)
        self._log_requests = list(resp.logs_requests)
        sent = {t.instance_id for t in hb.logs}
        self._tailed |= self._final_tails & sent
        self._final_tails -= sent
        self._refused_tails -= sent

        actions: list[Action] = []
        if observed is not None:  # without a view of the runtime, acting could duplicate work
            hold = start_held(self._start_failures, self.clock(), self.start_attempts)
            actions = reconcile(self.desired, view, known=self._known, hold=hold)
            actions += checkpoint_actions(self.desired, view, self._signalled, self.clock())
            # Removals left out at most once in a row: a host starting work in every
            # iteration (a burst) still removes what exited, every other iteration.
            ordered = starts_first(actions, self.desired, defer=not self._removals_deferred)
            self._removals_deferred = len(ordered) < len(actions)
            actions = ordered
            self._acted = self._apply(actions) > 0
        else:
            self._acted = False
        self._remove_volumes(resp.remove_volumes)
        self._start_moves(resp.volume_moves)
        wanted = {d.instance_id for d in self.desired}
        if observed is not None:
            self._known = (self._known | wanted) & ({o.instance_id for o in view} | wanted)
        self._exits = {k: v for k, v in self._exits.items() if k in wanted}
        self._signalled = {k: v for k, v in self._signalled.items() if k in wanted}
        self._exit_logged &= wanted
        self._start_failures = {k: v for k, v in self._start_failures.items() if k in wanted}
        self._notes = {k: v for k, v in self._notes.items() if k in wanted}
        self._restarts = {k: v for k, v in self._restarts.items() if k in wanted}

        duration_ms = round((self.clock() - started) * 1000, 1)
        level = (
            logging.INFO if any(not isinstance(a, ReportExit) for a in actions) else logging.DEBUG
        )
        logger.log(
            level,
            "iteration",
            extra={
                "host_id": self.state.host_id,
                "seq": self.seq,
                "desired": len(self.desired),
                "observed": None if observed is None else len(observed),
                "actions": [f"{type(a).__name__}:{a.instance_id}" for a in actions],
                "desired_version": resp.desired_version,
                "duration_ms": duration_ms,
            },
        )
        return self.interval_s

    def _log_retry(self, e: ControlPlaneError) -> float:
        delay = self._retry_delay()
        logger.warning(
            "control plane unreachable; containers left as they are",
            extra={
                "host_id": self.host_id,
                "error": str(e),
                "attempt": self.failures,
                "retry_in_s": round(delay, 2),
            },
        )
        return delay

    def _register(self) -> None:
        if not self.config.bootstrap_token:
            raise Unauthorized("no host token saved and no bootstrap token given")
        if self._inventory is None:
            self._inventory = self.backend.inventory()  # an exception here is retried
        cpus, mem = self.resources
        resp = self.client.register(
            RegisterRequest(
                bootstrap_token=self.config.bootstrap_token,
                hostname=self.config.hostname,
                agent_version=__version__,
                gpu_backend=self.backend.name,
                runtime=self.runtime.name,
                cpu_count=cpus,
                memory_mib=mem,
                gpus=self._inventory,
                previous_host_token=self._previous_token,
                # the same for every attempt until one is answered: a retry of an attempt
                # whose answer was lost gets the same host again (never logged)
                registration_nonce=registration_nonce(self.config.state_dir),
            )
        )
        self._previous_token = None
        self.state = HostState(self.config.server, resp.host_id, resp.host_token)
        save_state(self.config.state_dir, self.state)
        clear_registration_nonce(self.config.state_dir)  # the next registration: a new one
        self.interval_s = resp.heartbeat_interval_s
        logger.info(
            "registered",
            extra={"host_id": resp.host_id, "gpus": [g.uuid for g in self._inventory]},
        )

    def _observe(self) -> list[ObservedContainer] | None:
        try:
            observed = self.runtime.list()
        except Exception as e:
            logger.error("runtime list failed", extra={"host_id": self.host_id, "error": str(e)})
            return None
        present = {o.instance_id for o in observed}
        self._tailed &= present
        self._final_tails &= present
        for o in observed:
            if o.state == "exited":
                self._exits[o.instance_id] = o
                if o.instance_id not in self._tailed:
                    self._final_tails.add(o.instance_id)
            if o.state == "running":
                self._start_failures.pop(o.instance_id, None)
        self._watch(observed)
        return observed

    def _watch(self, observed: list[ObservedContainer]) -> None:
        """Notice a container of desired work that is gone, restarted or replaced without
        this agent's order (its own removals forget the container first, `_apply`)."""
        wanted = {d.instance_id for d in self.desired}
        now = {o.instance_id: o for o in observed}
        for iid, (cid, started) in list(self._containers.items()):
            o = now.get(iid)
            if o is None:
                del self._containers[iid]
                if iid in wanted:
                    since = f", running since {started}" if started else ""
                    self._notes[iid] = (f"container {cid[:12]}{since} is gone; the agent did not remove it "
                                        "(removed outside gpucloud, or the engine lost it)")
                    logger.warning("container gone without the agent's order",
                                   extra={"host_id": self.host_id, "instance_id": iid, "container_id": cid})
                continue
            if o.container_id and o.container_id != cid:
                what = f"container {cid[:12]} was replaced by {o.container_id[:12]} outside the agent"
            elif started and o.started_at and o.started_at != started:
                what = f"container {cid[:12]} started again at {o.started_at} (first at {started}) " \
                       "without the agent's order"
            else:
                if started is None and o.started_at:
                    self._containers[iid] = (cid, o.started_at)
                continue
            self._restarts[iid] = self._restarts.get(iid, 0) + 1
            self._notes[iid] = what
            self._containers[iid] = (o.container_id or cid, o.started_at)
            logger.warning("container restarted without the agent's order",
                           extra={"host_id": self.host_id, "instance_id": iid, "restarts": self._restarts[iid]})
        for iid, o in now.items():
            if iid in wanted and iid not in self._containers and o.container_id and o.state != "created":
                self._containers[iid] = (o.container_id, o.started_at)

    def _notes_now(self) -> dict[str, str]:
        """The agent's notes, and the runtime's (a stand-in image run in place of the one asked
        for), the agent's first."""
        runtime_notes: dict[str, str] = getattr(self.runtime, "notes", None) or {}
        return {**runtime_notes, **self._notes}

    def _logs(self) -> list[ContainerLogTail]:
        """Tails for the pending requests, then the last output of containers that exited
        ('' when the container is gone or the call fails).

        All of them together stay within ``HEARTBEAT_LOGS_MAX_BYTES`` of JSON: the first
        is clipped to it, and what does not fit goes in a later heartbeat (the control plane
        asks again for a request it did not get an answer to).
        """
        wanted = [(q.instance_id, q.tail) for q in self._log_requests]
        asked = {iid for iid, _ in wanted}
        wanted += [(iid, FINAL_TAIL_LINES) for iid in sorted(self._final_tails - asked)]
        out: list[ContainerLogTail] = []
        budget = HEARTBEAT_LOGS_MAX_BYTES
        for iid, tail in wanted:
            if budget < HEARTBEAT_LOGS_MAX_BYTES // 8 and out:
                break  # the rest in the next heartbeat
            try:
                text = "" if iid in self._refused_tails else self.runtime.logs(iid, tail=tail)
            except Exception as e:
                logger.error(
                    "runtime logs failed",
                    extra={"host_id": self.host_id, "instance_id": iid, "error": str(e)},
                )
                text = ""
            clipped, truncated = clip_log(text, max_bytes=budget)
            budget -= json_size(clipped) + len(iid) + 64  # the object around it
            out.append(ContainerLogTail(iid, clipped, truncated))
        return out

    def _sample(self) -> list[GpuSample]:
        try:
            return self.backend.sample()
        except Exception as e:
            logger.error("gpu sample failed", extra={"host_id": self.host_id, "error": str(e)})
            return []

    def _start_failed(self, iid: str, error: str) -> None:
        """Count a failed start, back off the next, and remove what it left (a created
        container: the runtime refused to start it), so the report says ``missing`` with
        the runtime's message and the control plane can bound it."""
        prev = self._start_failures.get(iid)
        delay = backoff(prev.attempts if prev else 0, self.config.backoff_base_s,
                        self.config.backoff_cap_s, self.rng)
        f = self._start_failures[iid] = start_failed(prev, error, self.clock(), delay)
        self._containers.pop(iid, None)
        try:
            self.runtime.remove(iid)
        except Exception as e:  # noqa: BLE001 - removed at the next pass
            logger.warning("failed start not cleaned up", extra={"instance_id": iid, "error": str(e)})
        if f.attempts >= self.start_attempts:
            logger.error("start given up", extra={"host_id": self.host_id, "instance_id": iid,
                                                  "attempts": f.attempts, "error": error})

    def _apply(self, actions: list[Action]) -> int:
        """Carry out ``actions``; how many containers were started or stopped."""
        changed = 0
        for a in actions:
            iid = a.instance_id
            try:
                if isinstance(a, Start):
                    cid = self.runtime.run(a.spec)
                    changed += 1
                    self._start_failures.pop(iid, None)
                    self._notes.pop(iid, None)  # (a lost container recreated: said once)
                    self._containers[iid] = (cid, None)
                    logger.info(
                        "container started",
                        extra={
                            "host_id": self.host_id,
                            "instance_id": iid,
                            "container_id": cid,
                            "gpus": a.spec.gpu_uuids,
                        },
                    )
                elif isinstance(a, Stop):
                    self.runtime.stop(iid)
                    changed += 1
                    logger.info(
                        "container stopped", extra={"host_id": self.host_id, "instance_id": iid}
                    )
                elif isinstance(a, Signal):
                    # the grace counts from now even if sending fails: the stop still comes
                    self._signalled[iid] = self.clock()
                    self.runtime.signal(iid, a.signal)
                    logger.info(
                        "checkpoint signal sent",
                        extra={"host_id": self.host_id, "instance_id": iid, "signal": a.signal},
                    )
                elif isinstance(a, Remove):
                    self._containers.pop(iid, None)  # its own order: not a loss
                    self.runtime.remove(iid)
                    self._exits.pop(iid, None)
                    logger.info(
                        "container removed", extra={"host_id": self.host_id, "instance_id": iid}
                    )
                elif isinstance(a, ReportExit) and iid not in self._exit_logged:
                    self._exit_logged.add(iid)
                    logger.info(
                        "container exited",
                        extra={
                            "host_id": self.host_id,
                            "instance_id": iid,
                            "exit_code": a.exit_code,
                        },
                    )
            except Exception as e:
                if isinstance(a, Start):
                    self._start_failed(iid, str(e))
                logger.error(
                    "container action failed",
                    extra={
                        "host_id": self.host_id,
                        "instance_id": iid,
                        "action": type(a).__name__,
                        "error": str(e),
                    },
                )
        return changed
