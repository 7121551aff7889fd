"""A study's database, made cheap to write: SQLite in WAL mode, and a trial's writes in one transaction.

Optuna's RDB storage commits every write on its own: a trial of the search space sets 30 to 37
parameters and five attributes, each an SQLite transaction that, in the default rollback-journal mode
with ``synchronous=FULL``, syncs the disk twice. A 200-trial search spent more time committing than
simulating. Two changes keep every guarantee a study had:

- :func:`prepare_sqlite` puts each connection in WAL mode with ``synchronous=NORMAL``: a commit appends
  to the log without syncing it (the log is synced at checkpoints). A process that is killed loses
  nothing it committed (the log is in the operating system's hands); a power cut can lose the last
  commits, never the database's consistency. Every transaction still takes the write lock when it
  begins (``BEGIN IMMEDIATE``), so that several processes on one study stay atomic.
- :class:`BatchedStorage` keeps a trial's parameter and attribute writes in memory and commits them
  together in one transaction, before anything reads the study or changes the trial's state, and where
  the search asks (:func:`flush`: once a trial has named its process, once it has chosen its
  parameters). Another process sees a trial's parameters once it has chosen them all (optuna's constant
  liar for ``--workers``), and a finished trial has all of its writes, as before.
"""

from __future__ import annotations

import threading
from typing import Any

import optuna
import sqlalchemy
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session


def prepare_sqlite(engine) -> None:
    """Set up every connection of an SQLite ``engine``: WAL with ``synchronous=NORMAL`` (where the
    database can be written), and transactions that take the write lock when they begin.

    ``BEGIN IMMEDIATE`` makes optuna's read-then-write steps atomic between processes: pysqlite begins a
    transaction only at the first write, so a read before it would run outside any lock, and two
    processes popping the same waiting trial would both read it WAITING, both mark it RUNNING and both
    evaluate it (the second to finish fails with "Cannot tell a COMPLETE trial"). A database that cannot
    be written (opened read-only) keeps its journal mode and begins plain transactions: its first write
    fails, with the read-only cause."""

    @sqlalchemy.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, connection_record) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN of its own
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")  # kept in the file: once is enough, each is cheap
        except Exception as exc:  # sqlite3.OperationalError: a read-only database stays as it is
            if "readonly" not in str(exc) and "read-only" not in str(exc):
                raise
        cursor.execute("PRAGMA synchronous=NORMAL")  # per connection: a commit does not sync the log
        cursor.close()

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(conn) -> None:
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except sqlalchemy.exc.OperationalError as exc:
            if "readonly" not in str(exc) and "read-only" not in str(exc):
                raise
            conn.exec_driver_sql("BEGIN")

    engine.dispose()  # connections made before the listeners (the tables' creation) are not reused


def release(storage) -> None:
    """Close the database connections ``storage`` (an optuna storage, batched or not) holds open; it opens
    new ones when next used.

    SQLite keeps, per process, what it knows of each open file (its locks, the WAL index's mapping). A
    process forked while a connection is open inherits that knowledge without the locks it describes (POSIX
    locks are not inherited), so a connection the child opens on the same file trusts locks nobody holds:
    it can read a WAL index another process is resetting (SQLITE_PROTOCOL, "locking protocol") and, once
    the parent is gone, others see no reader and reset the index under it. So no connection is open when
    the search forks its workers, and none is left open when it returns."""
    backend = getattr(storage, "_backend", storage)
    engine = getattr(backend, "engine", None)
    if engine is not None:
        engine.dispose()


def batched(storage):
    """``storage`` as optuna would use it, with a trial's writes batched (:class:`BatchedStorage`) where
    it is an RDB storage; any other (in memory) as it is."""
    return BatchedStorage(storage) if isinstance(storage, optuna.storages.RDBStorage) else storage


def count_trials(study, states: tuple[Any, ...]) -> int:
    """How many trials of ``study`` are in ``states`` (a COUNT where the storage batches writes)."""
    if isinstance(study._storage, BatchedStorage):
        return study._storage.count_trials(study._study_id, states)
    return len(study.get_trials(deepcopy=False, states=states))


def flush(trial) -> None:
    """Commit what ``trial`` (an optuna trial) has written so far, where its storage batches writes."""
    if isinstance(trial.storage, BatchedStorage):
        trial.storage.flush_trial(trial._trial_id)


class BatchedStorage(_CachedStorage):
    """Optuna's cached RDB storage (:class:`optuna.storages._CachedStorage`) that commits a trial's
    parameters and attributes in one transaction (see the module). A write is kept in memory, in order,
    until the trial's state changes, anything reads the study or the trial, or :meth:`flush_trial`; then
    every kept write of the trial goes in one transaction, each checked as optuna checks it (a finished
    trial cannot be written, a parameter keeps its distribution)."""

    def __init__(self, backend: optuna.storages.RDBStorage) -> None:
        super().__init__(backend)
        self._pending: dict[int, list[tuple[str, tuple[Any, ...]]]] = {}
        self._pending_lock = threading.Lock()

    # -- writes kept ------------------------------------------------------------------------------
    def _keep(self, trial_id: int, kind: str, args: tuple[Any, ...]) -> None:
        with self._pending_lock:
            self._pending.setdefault(trial_id, []).append((kind, args))

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: Any) -> None:
        self._keep(trial_id, "param", (param_name, param_value_internal, distribution))

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._keep(trial_id, "user", (key, value))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._keep(trial_id, "system", (key, value))

    def flush_trial(self, trial_id: int) -> None:
        """Commit the writes kept for ``trial_id``, in one transaction."""
        with self._pending_lock:
            writes = self._pending.pop(trial_id, None)
        if not writes:
            return
        backend = self._backend
        with self._lock:
            known = self._studies[self._trial_id_to_study_id_and_number[trial_id][0]].param_distribution
        seen: dict[str, Any] = {}
        with _create_scoped_session(backend.scoped_session) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
            backend.check_trial_is_updatable(trial_id, trial.state)  # once, not once a write
            for kind, args in writes:
                if kind == "param":
                    name, value, dist = args
                    if name in known:  # as optuna checks it, without reading the trial again
                        optuna.distributions.check_distribution_compatibility(known[name], dist)
                        session.add(models.TrialParamModel(
                            trial_id=trial_id, param_name=name, param_value=value,
                            distribution_json=optuna.distributions.distribution_to_json(dist)))
                    else:  # its first time in this process: optuna compares it with the study's first
                        backend._set_trial_param_without_commit(session, trial_id, name, value, dist)
                    seen.setdefault(name, dist)
                else:
                    model = models.TrialUserAttributeModel if kind == "user" else models.TrialSystemAttributeModel
                    backend._set_trial_attr_without_commit(session, model, trial_id, *args)
        with self._lock:  # as optuna's cache does: later trials check a parameter against its first distribution
            for name, dist in seen.items():
                known.setdefault(name, dist)

    def count_trials(self, study_id: int, states: tuple[Any, ...]) -> int:
        """How many trials of the study are in ``states``: one COUNT, not a read of the trials."""
        self._flush_all()
        with _create_scoped_session(self._backend.scoped_session) as session:
            return int(session.query(sqlalchemy.func.count(models.TrialModel.trial_id))
                       .filter(models.TrialModel.study_id == study_id, models.TrialModel.state.in_(states)).scalar())

    def _flush_all(self) -> None:
        with self._pending_lock:
            ids = list(self._pending)
        for trial_id in ids:
            self.flush_trial(trial_id)

    # -- what commits them first ------------------------------------------------------------------
    def set_trial_state_values(self, trial_id: int, state: Any, values: Any = None) -> bool:
        self.flush_trial(trial_id)
        return super().set_trial_state_values(trial_id, state=state, values=values)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self.flush_trial(trial_id)
        super().set_trial_intermediate_value(trial_id, step, intermediate_value)

    def get_trial(self, trial_id: int) -> Any:
        self.flush_trial(trial_id)
        return super().get_trial(trial_id)

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> Any:
        self._flush_all()
        return super().get_all_trials(study_id, deepcopy=deepcopy, states=states)

    def get_best_trial(self, study_id: int) -> Any:
        self._flush_all()
        return super().get_best_trial(study_id)

    def remove_session(self) -> None:
        self._flush_all()
        super().remove_session()
