"""The store's schema, one for SQLite and PostgreSQL: its tables, the statements both stores run (with `?`
placeholders; PostgreSQL's store turns them into `%s`) and how a node, a unit and a recall hit map to rows.

`flink_memory_nodes` holds each live node (its columns for queries and `body`, the node's JSON exactly as
written to summaries/) and each live memory unit (kind `unit`, keyed `unit:<id>`, `covered_by` its batch node),
each with the digest of its text and, once embedded, its vector (the meta table records the embedding model
and dimension: vectors of one model only). `flink_memory_replaced` holds every (agent, node id) that a written
node lists in `replaces`; the positions, applied files and pending deletions are the applier's bookkeeping
(flink_memory.store.sql says how writes use them).
"""

from __future__ import annotations

from typing import Any

from flink_memory.digests import digest_parts
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store.rules import UNIT_KIND, UNIT_PREFIX, UNIT_STEPS, Recalled, specificity_steps

SCHEMA_VERSION = 1
NODES = "flink_memory_nodes"
REPLACED = "flink_memory_replaced"
META = "flink_memory_store_meta"
GENERATIONS = "flink_memory_generations"  # per agent: bumped by every write (flink_memory.store.vectors)
POSITIONS = "flink_memory_positions"  # per agent: the last applied seq of its merger log and of its batcher log
APPLIED = "flink_memory_applied_files"  # the memory log's files applied to the end
PENDING_DELETES = "flink_memory_pending_deletes"  # deletions shown before their commit (unit id, or * for all)
BRANCHES = "flink_memory_branches"  # per agent and log: each branch applied, and where it forked from
ATTEMPTS = "flink_memory_attempts"  # per branch: the latest attempt of the job's provisional writer
FTS = "flink_memory_nodes_fts"  # SQLite only: FTS5 over the text and agent of NODES (PostgreSQL: a tsvector column)
COLUMNS = ("agent_id", "node_id", "kind", "level", "steps", "version", "item_count", "first_ts", "last_ts", "text",
           "body", "digest")
# columns added to a store of schema version 1 written before units and vectors (added on create)
ADDED = {"covered_by": "TEXT", "digest": "TEXT", "vector": "BLOB", "pending_seq": "BIGINT"}
PENDING_PREFIX = "pending:"  # a provisional unit row: `pending:<unit id>` (no node id starts so either)
# the tables of the applier's bookkeeping, the same in both stores
CREATE_LOG_TABLES = (  # (the index of provisional rows is made after the column: PENDING_INDEX)
    f"CREATE TABLE IF NOT EXISTS {POSITIONS} (agent_id TEXT PRIMARY KEY, merger_seq BIGINT NOT NULL, "
    "batcher_seq BIGINT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {APPLIED} (name TEXT PRIMARY KEY)",
    f"CREATE TABLE IF NOT EXISTS {PENDING_DELETES} (agent_id TEXT NOT NULL, unit_id TEXT NOT NULL, "
    "seq BIGINT NOT NULL, PRIMARY KEY (agent_id, unit_id))",
    f"CREATE TABLE IF NOT EXISTS {BRANCHES} (agent_id TEXT NOT NULL, log TEXT NOT NULL, branch TEXT NOT NULL, "
    "parent TEXT NOT NULL, parent_seq BIGINT NOT NULL, PRIMARY KEY (agent_id, log, branch))",
    f"CREATE TABLE IF NOT EXISTS {ATTEMPTS} (branch TEXT PRIMARY KEY, attempt BIGINT NOT NULL)",
)
# columns of the history (flink_memory.memory_log.Lineage), added to the tables of a store written before it: the
# history and branch of each log position; the branch of each provisional row, hidden row and pending deletion;
# and which log entry (writer, branch, seq) last wrote each row and each replacement, so a restore can drop
# what an abandoned branch applied
ADDED_LOG_COLUMNS = (
    (POSITIONS, "history", "TEXT NOT NULL DEFAULT ''"),
    (POSITIONS, "merger_branch", "TEXT NOT NULL DEFAULT ''"),
    (POSITIONS, "batcher_branch", "TEXT NOT NULL DEFAULT ''"),
    (PENDING_DELETES, "branch", "TEXT NOT NULL DEFAULT ''"),
    (NODES, "pending_branch", "TEXT NOT NULL DEFAULT ''"),
    (NODES, "pending_attempt", "BIGINT NOT NULL DEFAULT 0"),
    (PENDING_DELETES, "attempt", "BIGINT NOT NULL DEFAULT 0"),
    (NODES, "log_by", "TEXT"),
    (NODES, "log_branch", "TEXT"),
    (NODES, "log_seq", "BIGINT"),
    (REPLACED, "log_by", "TEXT"),
    (REPLACED, "log_branch", "TEXT"),
    (REPLACED, "log_seq", "BIGINT"),
)
LATEST = "~"  # a branch after every minted one (ids are digits and lower-case letters): writes outside the log
# PostgreSQL splits its search indexes (HNSW, full text) by agent into BUCKETS partial indexes, by the hash its own
# hash indexes keep stable: an agent's search reads its bucket's index, not every agent's
BUCKETS = 32
BUCKET = f"(hashtext(agent_id) & {BUCKETS - 1})"
BUCKET_OF = f"SELECT {BUCKET.replace('agent_id', '%s::text')}"
# what recall reads of a row
HIT = "node_id, kind, level, steps, text, covered_by, first_ts, last_ts"
HIT_WIDTH = HIT.count(",") + 1  # (a row read with its distance to the question has one more, last)

# The statements both stores run, with `?` placeholders (PostgreSQL's store turns them into `%s`).
RECORD_REPLACED = f"INSERT INTO {REPLACED} (agent_id, node_id) VALUES (?, ?) ON CONFLICT DO NOTHING"
DELETE_REPLACED = f"DELETE FROM {NODES} WHERE agent_id = ? AND node_id = ?"
UPSERT = (
    f"INSERT INTO {NODES} ({', '.join(COLUMNS)}) SELECT {', '.join('?' for _ in COLUMNS)} "
    f"WHERE NOT EXISTS (SELECT 1 FROM {REPLACED} r WHERE r.agent_id = ? AND r.node_id = ?) "
    f"ON CONFLICT (agent_id, node_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[2:])
    + f", vector = CASE WHEN {NODES}.digest = excluded.digest THEN {NODES}.vector END"
)
HIDDEN_KIND = "hidden"  # a committed unit a deletion or forget not committed yet hides (pending_seq: its seq)
# A committed unit row: hidden at once (and until the commit that reaches it) when a deletion of a later seq is
# pending, so an older commit applied late cannot show a deleted unit again
_HIDING = (f"FROM {PENDING_DELETES} d WHERE d.agent_id = ? AND d.unit_id IN (?, '*') AND "
           "((d.branch = ? AND d.seq > ?) OR d.branch > ?)")
# what an upsert of a unit row sets on conflict (its old vector only when its text stays)
_SET_UNIT_ROW = ("ON CONFLICT (agent_id, node_id) DO UPDATE SET "
                 + ", ".join(f"{c} = excluded.{c}" for c in (*COLUMNS[2:], "pending_seq", "pending_branch"))
                 + f", vector = CASE WHEN {NODES}.digest = excluded.digest THEN {NODES}.vector END")
UPSERT_UNIT = (
    f"INSERT INTO {NODES} ({', '.join(COLUMNS)}, pending_seq, pending_branch) SELECT "
    + ", ".join(f"CASE WHEN EXISTS (SELECT 1 {_HIDING}) THEN '{HIDDEN_KIND}' ELSE ? END" if c == "kind" else "?"
                for c in COLUMNS)
    + f", (SELECT MAX(d.seq) {_HIDING}), COALESCE((SELECT MAX(d.branch) {_HIDING}), '') WHERE true {_SET_UNIT_ROW}"
    # an update's new text: not the old batch node's (a replacement of that node must not remove it with
    # the units it dropped)
    + f", covered_by = CASE WHEN {NODES}.digest = excluded.digest THEN {NODES}.covered_by END"
    # (the same unit again, e.g. a confirmed provisional row: untouched)
    + f" WHERE {NODES}.body <> excluded.body OR {NODES}.kind <> excluded.kind"
)
# a committed unit whose provisional row holds the same text: the row is renamed (its full-text entry and
# vector stay), unless the unit's committed row is still there
PROMOTE = (f"UPDATE {NODES} SET node_id = ?, pending_seq = NULL, pending_branch = '' WHERE agent_id = ? AND "
           "node_id = ? AND digest = ? AND pending_branch = ? AND pending_seq <= ? "
           f"AND NOT EXISTS (SELECT 1 FROM {NODES} u WHERE u.agent_id = ? AND u.node_id = ?)")
COMMITTED_UNIT = f"(kind = '{UNIT_KIND}' AND pending_seq IS NULL) OR kind = '{HIDDEN_KIND}'"  # (shown or hidden)
# a batch node's units point at it (unless it is replaced already); units of a replaced batch node leave
COVER = (f"UPDATE {NODES} SET covered_by = ? WHERE agent_id = ? AND node_id = ? AND kind IN ('{UNIT_KIND}', "
         f"'{HIDDEN_KIND}') AND NOT EXISTS (SELECT 1 FROM {REPLACED} r WHERE r.agent_id = ? AND r.node_id = ?)")
UNCOVERED = f"DELETE FROM {NODES} WHERE agent_id = ? AND kind IN ('{UNIT_KIND}', '{HIDDEN_KIND}') AND covered_by = ?"
DELETE_UNIT = f"DELETE FROM {NODES} WHERE agent_id = ? AND node_id = ? AND kind IN ('{UNIT_KIND}', '{HIDDEN_KIND}')"
FORGET_UNITS = f"DELETE FROM {NODES} WHERE agent_id = ? AND ({COMMITTED_UNIT})"
# Provisional writes apply only ahead of the agent's committed position: a message the applier has already
# committed (a slow writer, a zombie attempt) changes nothing
# committed position in its branch, or be of a newer branch than the agent's (a restored job's, before its first
# commit); a write of an older branch (an abandoned job still running) changes nothing either
# (nor a write of another history than the agent's: another job's, refused by the applier too)
# (nor a write of an attempt the job has restarted since: a zombie of a failed attempt)
AHEAD = (f"? > COALESCE((SELECT CASE WHEN p.history NOT IN ('', ?) THEN {2**62} WHEN p.batcher_branch = ? "
         f"THEN p.batcher_seq WHEN p.batcher_branch < ? THEN 0 ELSE {2**62} END FROM {POSITIONS} p "
         f"WHERE p.agent_id = ?), 0) AND ? >= COALESCE((SELECT a.attempt FROM {ATTEMPTS} a WHERE a.branch = ?), 0)")
# A provisional row is fenced at every moment: not behind a deletion or forget already shown (a pending deletion
# of a later seq), and never over a provisional row of a later seq (a late, older write of an updated unit)
UPSERT_PENDING = (
    f"INSERT INTO {NODES} ({', '.join(COLUMNS)}, pending_seq, pending_branch, pending_attempt) SELECT "
    f"{', '.join('?' for _ in COLUMNS)}, ?, ?, ? WHERE {AHEAD} AND NOT EXISTS (SELECT 1 {_HIDING}) {_SET_UNIT_ROW}, "
    "pending_attempt = excluded.pending_attempt "
    f"WHERE {NODES}.pending_seq IS NOT NULL AND ({NODES}.pending_branch < excluded.pending_branch OR "
    f"({NODES}.pending_branch = excluded.pending_branch AND {NODES}.pending_seq <= excluded.pending_seq))"
)
# (a unit hidden by a later deletion keeps that deletion's seq: an older one must not shorten its hiding)
_NOT_HIDDEN_LATER = (f"(kind <> '{HIDDEN_KIND}' OR pending_seq IS NULL OR pending_branch < ? OR "
                     "(pending_branch = ? AND pending_seq < ?))")
HIDE_UNIT = (f"UPDATE {NODES} SET kind = '{HIDDEN_KIND}', pending_seq = ?, pending_branch = ?, pending_attempt = ? "
             "WHERE agent_id = ? "
             "AND node_id = ? AND "
             f"kind IN ('{UNIT_KIND}', '{HIDDEN_KIND}') AND {_NOT_HIDDEN_LATER} AND {AHEAD}")
HIDE_UNITS = (f"UPDATE {NODES} SET kind = '{HIDDEN_KIND}', pending_seq = ?, pending_branch = ?, pending_attempt = ? "
              "WHERE agent_id = ? "
              f"AND ({COMMITTED_UNIT}) "
              f"AND {_NOT_HIDDEN_LATER} AND {AHEAD}")
DROP_PENDING = (f"DELETE FROM {NODES} WHERE agent_id = ? AND node_id = ? AND kind = '{UNIT_KIND}' "
                f"AND pending_seq IS NOT NULL AND {AHEAD}")
DROP_ALL_PENDING = (f"DELETE FROM {NODES} WHERE agent_id = ? AND kind = '{UNIT_KIND}' AND pending_seq IS NOT NULL "
                    f"AND {AHEAD}")
PENDING_DELETE = (f"INSERT INTO {PENDING_DELETES} (agent_id, unit_id, seq, branch, attempt) SELECT ?, ?, ?, ?, ? "
                  f"WHERE {AHEAD} ON CONFLICT (agent_id, unit_id) DO UPDATE SET seq = excluded.seq, "
                  "branch = excluded.branch, attempt = excluded.attempt "
                  f"WHERE {PENDING_DELETES}.branch < excluded.branch OR ({PENDING_DELETES}.branch = excluded.branch "
                  f"AND {PENDING_DELETES}.seq < excluded.seq)")  # (a late, older deletion never lowers it)
# a commit that reached `seq`: provisional rows and pending deletions up to it are the committed rows' now,
# and a unit hidden by a deletion the commit did not make is shown again
# (those of an older branch are void: what an abandoned job showed and never committed in this history)
_REACHED = "((pending_branch = ? AND pending_seq <= ?) OR pending_branch < ?)"
UNHIDE = (f"UPDATE {NODES} SET kind = '{UNIT_KIND}', pending_seq = NULL, pending_branch = '' WHERE agent_id = ? AND "
          f"kind = '{HIDDEN_KIND}' AND {_REACHED}")
CONFIRMED_PENDING = (f"DELETE FROM {NODES} WHERE agent_id = ? AND pending_seq IS NOT NULL AND kind = '{UNIT_KIND}' "
                     f"AND {_REACHED}")
CONFIRMED_DELETES = f"DELETE FROM {PENDING_DELETES} WHERE agent_id = ? AND ((branch = ? AND seq <= ?) OR branch < ?)"
PENDING_INDEX = (f"CREATE INDEX IF NOT EXISTS {NODES}_pending ON {NODES} (agent_id, pending_seq) "
                 "WHERE pending_seq IS NOT NULL")
POSITION = (f"SELECT merger_seq, batcher_seq, merger_branch, batcher_branch, history FROM {POSITIONS} "
            "WHERE agent_id = ?")
SET_POSITION = (f"INSERT INTO {POSITIONS} (agent_id, merger_seq, batcher_seq, merger_branch, batcher_branch, history) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent_id) DO UPDATE SET merger_seq = excluded.merger_seq, "
                "batcher_seq = excluded.batcher_seq, merger_branch = excluded.merger_branch, "
                "batcher_branch = excluded.batcher_branch, history = excluded.history")
# A restarted attempt of the job's provisional writer (a failover: the same branch): what earlier attempts showed
# and no commit took is void (the replay shows its own again), and their late writes change nothing (AHEAD)
SET_ATTEMPT = (f"INSERT INTO {ATTEMPTS} (branch, attempt) VALUES (?, ?) ON CONFLICT (branch) DO UPDATE SET "
               f"attempt = excluded.attempt WHERE {ATTEMPTS}.attempt < excluded.attempt")
VOID_AGENTS = (f"SELECT DISTINCT agent_id FROM {NODES} WHERE pending_seq IS NOT NULL AND pending_branch = ? "
               "AND pending_attempt < ?")
VOID_HIDDEN = (f"UPDATE {NODES} SET kind = '{UNIT_KIND}', pending_seq = NULL, pending_branch = '' WHERE "
               f"kind = '{HIDDEN_KIND}' AND pending_branch = ? AND pending_attempt < ?")
VOID_PENDING = (f"DELETE FROM {NODES} WHERE kind = '{UNIT_KIND}' AND pending_seq IS NOT NULL AND pending_branch = ? "
                "AND pending_attempt < ?")
VOID_DELETES = f"DELETE FROM {PENDING_DELETES} WHERE branch = ? AND attempt < ?"
# which log entry wrote a row or a replacement last (a replacement keeps its first: the same in every branch)
MARK_ROW = f"UPDATE {NODES} SET log_by = ?, log_branch = ?, log_seq = ? WHERE agent_id = ? AND node_id = ?"
MARK_REPLACED = (f"UPDATE {REPLACED} SET log_by = ?, log_branch = ?, log_seq = ? WHERE agent_id = ? AND node_id = ? "
                 "AND log_by IS NULL")
RECORD_BRANCH = (f"INSERT INTO {BRANCHES} (agent_id, log, branch, parent, parent_seq) VALUES (?, ?, ?, ?, ?) "
                 "ON CONFLICT DO NOTHING")
BRANCHES_OF = f"SELECT branch, parent, parent_seq FROM {BRANCHES} WHERE agent_id = ? AND log = ?"
# a row's covering batch node as a new branch's snapshot says (its batch node may come later, or be held)
SET_COVER = f"UPDATE {NODES} SET covered_by = ? WHERE agent_id = ? AND node_id = ?"


def off_chain(table: str, chain: list[tuple[str, int]]) -> str:
    """Delete the agent's rows of `table` that one writer's log entries wrote outside `chain` (branch, last seq
    of it in the lineage): what an abandoned branch applied. (Parameters: agent, writer.)"""
    kept = " OR ".join(f"(log_branch = '{branch}' AND log_seq <= {int(seq)})" for branch, seq in chain) or "false"
    return f"DELETE FROM {table} WHERE agent_id = ? AND log_by = ? AND NOT ({kept})"
APPLIED_FILE = f"INSERT INTO {APPLIED} (name) VALUES (?) ON CONFLICT DO NOTHING"
CURRENT = f"SELECT body FROM {NODES} WHERE agent_id = ? AND kind = 'global' ORDER BY version DESC LIMIT 1"
NODE = f"SELECT body FROM {NODES} WHERE agent_id = ? AND node_id = ? AND kind NOT IN ('{UNIT_KIND}', '{HIDDEN_KIND}')"
ALL_OF_AGENT = (f"SELECT body FROM {NODES} WHERE agent_id = ? AND kind NOT IN ('{UNIT_KIND}', '{HIDDEN_KIND}') "
                "ORDER BY steps, node_id")
UNITS_OF_AGENT = (f"SELECT node_id, body, covered_by FROM {NODES} WHERE agent_id = ? AND kind = '{UNIT_KIND}' "
                  "ORDER BY node_id")
ROWS_OF_AGENT = f"SELECT count(*) FROM {NODES} WHERE agent_id = ?"
UNEMBEDDED = f"SELECT node_id, text, digest FROM {NODES} WHERE agent_id = ? AND vector IS NULL AND text <> ''"
SET_VECTOR = f"UPDATE {NODES} SET vector = ? WHERE agent_id = ? AND node_id = ? AND digest = ?"
VECTORS_OF_AGENT = f"SELECT node_id, vector FROM {NODES} WHERE agent_id = ? AND vector IS NOT NULL"
BUMP = (f"INSERT INTO {GENERATIONS} (agent_id, generation) VALUES (?, 1) ON CONFLICT (agent_id) "
        f"DO UPDATE SET generation = {GENERATIONS}.generation + 1")
GENERATION = f"SELECT generation FROM {GENERATIONS} WHERE agent_id = ?"
CREATE_GENERATIONS = f"CREATE TABLE IF NOT EXISTS {GENERATIONS} (agent_id TEXT PRIMARY KEY, generation BIGINT NOT NULL)"
META_VALUE = f"SELECT value FROM {META} WHERE key = ?"
MODEL_KEYS = "key IN ('embedding_model', 'embedding_dim')"  # the meta rows that record the vectors' model
MODEL = f"SELECT key, value FROM {META} WHERE {MODEL_KEYS}"
SET_META = f"INSERT INTO {META} (key, value) VALUES (?, ?) ON CONFLICT DO NOTHING"
AGENTS = f"SELECT DISTINCT agent_id FROM {NODES} ORDER BY agent_id"
HAS_AGENT = f"SELECT 1 FROM {NODES} WHERE agent_id = ? LIMIT 1"
SCHEMA = f"SELECT value FROM {META} WHERE key = 'schema_version'"
INIT_META = f"INSERT INTO {META} (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT DO NOTHING"


def text_digest(text: str) -> str:
    return digest_parts((text,))


def node_row(node: SummaryNode) -> tuple[Any, ...]:
    return (node.agent_id, node.node_id, node.kind, node.level, specificity_steps(node.kind, node.level),
            node.version, node.item_count, node.first_ts, node.last_ts, node.text, node.model_dump_json(),
            text_digest(node.text))


def unit_row(unit: MemoryUnit, prefix: str = UNIT_PREFIX) -> tuple[Any, ...]:
    return (unit.agent_id, prefix + unit.unit_id, UNIT_KIND, 0, UNIT_STEPS, None, 1, unit.ts, unit.ts,
            unit.text, unit.model_dump_json(), text_digest(unit.text))


def hit(row: tuple[Any, ...], score: float) -> Recalled:
    """A Recalled from the HIT columns of a row."""
    key, kind, level, _steps, text, covered_by, first_ts, last_ts = row
    provisional = key.startswith(PENDING_PREFIX)
    node_id = key.removeprefix(PENDING_PREFIX if provisional else UNIT_PREFIX) if kind == UNIT_KIND else key
    return Recalled(node_id=node_id, kind=kind, level=level, text=text, score=float(f"{score:.6g}"),
                    first_ts=first_ts, last_ts=last_ts, covered_by=covered_by, provisional=provisional)
