"""The store in PostgreSQL tables that every TaskManager (and any reader) reaches; the same rows as SQLite.

Vectors: with the pgvector extension, the `vector` column is pgvector's `vector`, indexed by HNSW (inner
product, which orders unit vectors as cosine does) once the store records its model's dimension, and a
recall asks PostgreSQL for the agent's nearest rows (flink_memory.store.pgvector). The writer creates the
extension when the server has it (it needs the right to CREATE EXTENSION) and converts a store whose
vectors were written as bytes. Without it the column is bytea and each reader searches its agents' vectors
exactly in memory (flink_memory.store.vectors), as on SQLite; the writer logs which one it found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flink_memory.databases import PostgresConnection, redact_url
from flink_memory.meanwhile import meanwhile
from flink_memory.store import pgvector
from flink_memory.store.connection import Checks, Statements, StoreConnection
from flink_memory.store.recall import VECTOR_CANDIDATES, ByMeaning
from flink_memory.store.rules import StoreError, tsquery_term
from flink_memory.store.schema import (
    ADDED_LOG_COLUMNS,
    BUCKET,
    BUCKET_OF,
    BUCKETS,
    CREATE_GENERATIONS,
    CREATE_LOG_TABLES,
    GENERATIONS,
    HIT,
    HIT_WIDTH,
    INIT_META,
    META,
    MODEL_KEYS,
    NODES,
    PENDING_INDEX,
    REPLACED,
)
from flink_memory.store.sql import MemoryStore
from flink_memory.store.vector_rows import BytesColumn, VectorRows

log = logging.getLogger(__name__)
T = TypeVar("T")

RARE_SHARE = 0.01  # a term in fewer of the table's rows is rare: all its matches of the agent are ranked
MATCH_CAP = 5000  # matches of the rare terms ranked at most
COMMON_RANKED = 2  # matches of the common terms ranked per row still wanted
# the lexemes among the tsvector column's most common elements, in at least RARE_SHARE of the rows (read once
# per TERMS_KNOWN_S: pg_stats is a view of four catalogs, 1-2 ms a question when asked per term)
COMMON_LEXEMES = (
    "SELECT m.e FROM pg_stats s, unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs) m(e, f) "
    f"WHERE s.schemaname = current_schema() AND s.tablename = '{NODES}' AND s.attname = 'tsv' AND m.f >= %s")
TERM_LEXEMES = "ARRAY(SELECT lexeme FROM unnest(to_tsvector('english', t)))"  # a term t's lexemes
LEXEMES = f"SELECT t, {TERM_LEXEMES} FROM unnest(%s::text[]) t"
# what a recall reads as it starts, in one round trip: the model's record, the agent's generation and the
# lexemes of the question's terms not yet known (PostgresSearch.facts)
FACTS = (f"SELECT 'model', key, value, NULL::text[] FROM {META} WHERE {MODEL_KEYS} "
         f"UNION ALL SELECT 'generation', NULL, generation::text, NULL::text[] FROM {GENERATIONS} WHERE agent_id = %s "
         f"UNION ALL SELECT 'term', t, NULL, {TERM_LEXEMES} FROM unnest(%s::text[]) t")
# The keyword candidates in one statement: the rare terms' matches (at most MATCH_CAP) ranked by ts_rank_cd over
# every term, then, while fewer than `limit`, COMMON_RANKED matches of the common terms per row still wanted
# (a LIMIT of 0 runs nothing). The bucket is a literal: the planner matches it to its partial index's predicate.
MATCHES = (f"SELECT {HIT}, tsv{{vector}} FROM {NODES} WHERE agent_id = %(agent)s AND {BUCKET} = {{bucket}} AND "
           "tsv @@ to_tsquery('english', %({kind})s) LIMIT {cap}")
# (the common terms' matches planned for their most, COMMON_RANKED per row of `limit`, then cut to those still
# wanted when it runs: a LIMIT unknown when planning is taken for a tenth of the matches, read by bitmaps)
STILL_WANTED = f"SELECT * FROM ({{matches}}) c LIMIT {COMMON_RANKED} * (%(limit)s - (SELECT count(*) FROM rare))"
PASS = (f"SELECT {{place}} AS place, {HIT}{{vector}}, ts_rank_cd(tsv, to_tsquery('english', %(every)s), 1) AS rank "
        "FROM ({matches}) m ORDER BY rank DESC LIMIT %(limit)s")
# each row with its distance to the question (pgvector's negative inner product) when it is known: computed on
# the server for the rows kept, 8 bytes a row sent rather than the vector's 1 KB (2 ms of 400 rows' vectors)
DISTANCE = ", vector <#> %(question)s::vector"
KEYWORD_INDEX = f"{NODES}_tsv"  # KEYWORD_INDEX_0 .. _31, one per bucket (before them: one, KEYWORD_INDEX)
TERMS_KNOWN_S = 300.0  # how long a reader trusts the common lexemes (statistics change on ANALYZE)
TERMS_KEPT = 100_000  # terms remembered at most (then forgotten all at once)
BUCKET_STATISTICS = f"{NODES}_bucket"  # the planner's statistics of an agent with its bucket (_bucket_statistics)
# the store's connections plan for rows and indexes read from memory, as a recall's are (PostgreSQL's default of
# 4 prices each page an index scan reads as a disk seek: a keyword search then built a bitmap of every one of an
# agent's 100 000 rows to spare reading a few pages of other agents' rows; a server set lower keeps its own)
RANDOM_PAGE_COST = 1.1
PLAN_FOR_MEMORY = ("SELECT set_config('random_page_cost', LEAST(current_setting('random_page_cost')::float8, "
                   f"{RANDOM_PAGE_COST})::text, false)")


def _keyword_indexes(conn: Any, location: str) -> None:
    """The full-text GIN index of each bucket, unless it exists; the one index of a store written before them is
    replaced (once: a store of many rows takes a while, logged)."""
    missing = [b for b in range(BUCKETS)
               if conn.execute("SELECT to_regclass(%s)", (f"{KEYWORD_INDEX}_{b}",)).fetchone()[0] is None]
    if not missing:
        return
    if conn.execute("SELECT to_regclass(%s)", (KEYWORD_INDEX,)).fetchone()[0] is not None:
        log.warning("%s: building the full-text index of each of %d buckets of agents (once)", location, BUCKETS)
    for bucket in missing:
        conn.execute(f"CREATE INDEX IF NOT EXISTS {KEYWORD_INDEX}_{bucket} ON {NODES} USING GIN (tsv) "
                     f"WHERE {BUCKET} = {bucket}")
    conn.execute(f"DROP INDEX IF EXISTS {KEYWORD_INDEX}")


def _bucket_statistics(conn: Any, location: str) -> None:
    """Extended statistics that tell the planner an agent's rows are all in its bucket, unless they exist, and
    the table analyzed once for them (seconds for a million rows). Without them it takes the bucket's rows
    (an expression it has no statistics of) for 0.5% of the table and the agent's among them for as small a
    share of those, and plans a search of a large agent for a few rows: a bitmap of each of a common term's
    matches where reading the agent's rows in order stops at the few hundred it wants. (PostgreSQL 14 and later:
    an older server plans without them.)"""
    if conn.info.server_version < 140000 or conn.execute(
            "SELECT 1 FROM pg_statistic_ext WHERE stxname = %s AND stxnamespace = current_schema()::regnamespace",
            (BUCKET_STATISTICS,)).fetchone() is not None:
        return
    conn.execute(f"CREATE STATISTICS IF NOT EXISTS {BUCKET_STATISTICS} (dependencies) ON agent_id, ({BUCKET}) "
                 f"FROM {NODES}")
    if conn.execute(f"SELECT 1 FROM {NODES} LIMIT 1").fetchone() is not None:
        log.warning("%s: analyzing the store's rows for the planner's statistics of agents' buckets (once)", location)
        conn.execute(f"ANALYZE {NODES}")


def postgres_store(url: str, *, create: bool = False) -> MemoryStore:
    """The store in the PostgreSQL database at `url` (`create`: the tables too, when missing)."""
    connection = PostgresStoreConnection(url, create=create)
    column = PgvectorColumn(connection) if connection.vector_kind.extension else BytesColumn()
    return MemoryStore(connection, VectorRows(connection, column), PostgresSearch(connection))


class PostgresStoreConnection(StoreConnection):
    """One autocommit connection (flink_memory.databases.PostgresConnection); a write is one transaction holding
    each agent's advisory lock, a change of the schema or its indexes one holding the schema's (`LOCK_ID`)."""

    placeholder = "%s"
    LOCK_ID = 0x666D7374  # advisory lock of schema creation (per-agent writes lock on the agent's hash)

    def __init__(self, url: str, *, create: bool = False) -> None:
        self.location = redact_url(url)
        self._db = PostgresConnection(url, setting="store.url", application_name="flink-memory store",
                                      setup=lambda conn: conn.execute(PLAN_FOR_MEMORY))
        self.missing_table = (self._db.psycopg.errors.UndefinedTable,)
        try:
            if create:
                self.change_schema(self._create_schema)
            self.check_schema()
            self.vector_kind: pgvector.Vectors = self._db.run(pgvector.Vectors.of_store)  # pgvector or bytea
        except self._db.psycopg.OperationalError as exc:
            self._db.close()
            raise StoreError(f"cannot reach the memory store at {self.location}: {exc}") from None
        except StoreError:
            self._db.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresStoreConnection({self.location!r})"

    def another(self, application_name: str, settings: tuple[str, ...]) -> PostgresConnection:
        """A second connection to the same database, its session set by `settings` (statements)."""
        return PostgresConnection(self._db.url, setting="store.url", application_name=application_name,
                                  setup=lambda conn: [conn.execute(setting) for setting in settings])

    def run(self, call: Callable[[Any], T]) -> T:
        """`call` on the store's connection."""
        return self._db.run(call)

    def change_schema(self, change: Callable[[Any], None]) -> None:
        """`change` (of the tables or their indexes) in one transaction holding the schema's lock."""
        def locked(conn: Any) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.LOCK_ID,))
                change(conn)

        self._db.run(locked)

    def _create_schema(self, conn: Any) -> None:
        """The tables, their indexes and pgvector, when missing (under the schema's lock: concurrent CREATE ... IF
        NOT EXISTS can collide in pg_type without it)."""
        conn.execute(f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(INIT_META)
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {NODES} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
            "kind TEXT NOT NULL, level INTEGER NOT NULL, steps INTEGER NOT NULL, version INTEGER, "
            "item_count INTEGER NOT NULL, first_ts TEXT, last_ts TEXT, text TEXT NOT NULL, body TEXT NOT NULL, "
            "tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED, "
            "PRIMARY KEY (agent_id, node_id))")
        extension = pgvector.enable(conn, self.location)
        # (columns of units and vectors: added to a store written before them too)
        conn.execute(f"ALTER TABLE {NODES} ADD COLUMN IF NOT EXISTS covered_by TEXT, "
                     "ADD COLUMN IF NOT EXISTS digest TEXT, ADD COLUMN IF NOT EXISTS pending_seq BIGINT, "
                     f"ADD COLUMN IF NOT EXISTS vector {'vector' if extension else 'BYTEA'}")
        if extension:
            pgvector.convert_bytes(conn, self.location)
            dim = conn.execute(f"SELECT value FROM {META} WHERE key = 'embedding_dim'").fetchone()
            if dim is not None:
                pgvector.create_index(conn, int(dim[0]))
        conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_globals ON {NODES} (agent_id, kind, version)")
        conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_covered ON {NODES} (agent_id, covered_by)")
        conn.execute(PENDING_INDEX)
        _keyword_indexes(conn, self.location)
        _bucket_statistics(conn, self.location)
        conn.execute(CREATE_GENERATIONS)
        for statement in CREATE_LOG_TABLES:
            conn.execute(statement)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {REPLACED} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
                     "PRIMARY KEY (agent_id, node_id))")
        # (a store written before histories: only the columns it lacks, as ALTER TABLE locks the table and
        # would deadlock with the writers of a store already open)
        present = set(conn.execute("SELECT table_name, column_name FROM information_schema.columns WHERE "
                                   "table_schema = current_schema()").fetchall())
        for table, column, kind in ADDED_LOG_COLUMNS:
            if (table, column) not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")

    def fetch(self, sql: str, params: tuple[Any, ...], *, binary: bool = False) -> list[tuple[Any, ...]]:
        # planned for its parameters each time: psycopg prepares a statement run five times, and PostgreSQL may
        # then reuse one generic plan, which for a query by agent fits one size of agent only (a sequential
        # scan for an agent of 100 000 rows made every keyword query of the others cost 100-200 ms)
        return self.reach(self._db, lambda c: c.cursor(binary=binary).execute(sql, params, prepare=False).fetchall())

    def reach(self, db: PostgresConnection, call: Callable[[Any], T]) -> T:
        """`call` on one of the store's connections; a server out of reach is a StoreError (the service answers
        503, not a crash)."""
        try:
            return db.run(call)
        except self._db.psycopg.OperationalError as exc:
            raise StoreError(f"cannot reach the memory store at {self.location}: {exc}") from None

    def write(self, agents: list[str], statements: Statements, checks: Checks | None = None) -> None:
        def write(conn: Any) -> None:
            with conn.transaction():
                for agent in agents:  # sorted: two writers of the same agents take the locks in one order
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (agent,))
                self._checked(conn.execute, statements, checks)

        self._db.run(write)

    def close(self) -> None:
        self._db.close()


class PgvectorColumn:
    """pgvector's `vector` column: a vector written as text, indexed by HNSW once the store records its model's
    dimension (the index is of one dimension: dropped when the vectors are)."""

    def __init__(self, connection: PostgresStoreConnection) -> None:
        self.connection = connection
        self._indexed = False  # the HNSW index is known to exist

    def value(self, vector: Any) -> Any:
        return pgvector.text(vector)

    def recorded(self, dim: int) -> None:
        if not self._indexed:
            self.connection.change_schema(lambda conn: pgvector.create_index(conn, dim))
            self._indexed = True

    def forgotten(self) -> None:
        self.connection.change_schema(pgvector.drop_index)
        self._indexed = False


class PostgresSearch:
    """Full text by a stored `english` tsvector column (GIN index per bucket of agents), which finds the
    candidates (rare terms first); by meaning, pgvector's HNSW index on a second connection, or (without the
    extension) the reader's exact search of its cached vectors."""

    def __init__(self, connection: PostgresStoreConnection) -> None:
        self.connection = connection
        self.vectors = connection.vector_kind
        self._search_db: PostgresConnection | None = None  # (recall's search by meaning, opened at its first)
        self._lexemes: dict[str, tuple[str, ...]] = {}  # term -> its lexemes (to_tsvector's)
        self._common: tuple[frozenset[str], float] = (frozenset(), -TERMS_KNOWN_S)  # common lexemes, when read
        self._buckets: dict[str, int] = {}  # agent -> its bucket
        self._sizes: dict[str, tuple[int, float]] = {}  # agent -> (its rows up to EXACT_BELOW, when counted)

    def matching(self, agent_id: str, terms: list[str], limit: int, *,
                 question: Any | None = None) -> list[tuple[Any, ...]]:
        """The agent's rows holding a rare term of the question (in under RARE_SHARE of the table's rows, by
        PostgreSQL's statistics of the tsvector column), ranked by ts_rank_cd over all the terms; then, up to
        `limit`, rows holding its common terms, the best of COMMON_RANKED per row wanted. Bounded so (at most
        MATCH_CAP matches of rare terms), since a word in most of an agent's 100 000 rows would otherwise cost
        a rank of each (hundreds of milliseconds), where its matches add little: its weight is low. With the
        `question`'s vector, each row has its distance to it last (None: no vector yet)."""
        question = question if self.vectors.extension else None  # (bytes: scored from the reader's matrix)
        common = self._common_terms(terms)
        kinds = {kind: some for kind, some in (("rare", [t for t in terms if t not in common]),
                                              ("common", [t for t in terms if t in common])) if some}
        vector, bucket = ("" if question is None else ", vector"), self._bucket_of(agent_id)

        def matches(kind: str) -> str:
            cap = MATCH_CAP if kind == "rare" else f"{COMMON_RANKED} * %(limit)s"
            found = MATCHES.format(vector=vector, bucket=bucket, kind=kind, cap=cap)
            return STILL_WANTED.format(matches=found) if kind == "common" and "rare" in kinds else found

        parts = ", ".join(f"{kind} AS MATERIALIZED ({PASS.format(place=place, vector=vector, matches=matches(kind))})"
                          for place, kind in enumerate(kinds))
        sql = (f"WITH {parts} SELECT {HIT}{DISTANCE if question is not None else ''} FROM "
               f"({' UNION ALL '.join(f'SELECT * FROM {kind}' for kind in kinds)}) f ORDER BY place, rank DESC")
        params = {"agent": agent_id, "limit": limit, "every": " | ".join(map(tsquery_term, terms)),
                  **{kind: " | ".join(map(tsquery_term, some)) for kind, some in kinds.items()}}
        if question is not None:
            params["question"] = pgvector.text(question)
        found: dict[str, tuple[Any, ...]] = {}
        for row in self.connection.fetch(sql, params):
            found.setdefault(row[0], row)
        return list(found.values())[:limit]

    def _bucket_of(self, agent_id: str) -> int:
        """The agent's bucket (it never changes: remembered)."""
        if agent_id not in self._buckets:
            if len(self._buckets) > TERMS_KEPT:
                self._buckets.clear()
            self._buckets[agent_id] = int(self.connection.fetch(BUCKET_OF, (agent_id,))[0][0])
        return self._buckets[agent_id]

    def facts(self, agent_id: str, terms: list[str]) -> tuple[dict[str, str], int | None] | None:
        """The model's record and the agent's generation, with the lexemes of the terms not yet known, in one
        statement (a store written before generations: None, read as other stores read them)."""
        unknown = self._unknown_terms(terms)
        try:
            rows = self.connection.fetch(FACTS, (agent_id, unknown))
        except self.connection.missing_table:
            return None
        self._lexemes.update((term, tuple(lexemes)) for kind, term, _, lexemes in rows if kind == "term")
        generations = [int(value) for kind, _, value, _ in rows if kind == "generation"]
        return {key: value for kind, key, value, _ in rows if kind == "model"}, (generations or [0])[0]

    def _unknown_terms(self, terms: list[str]) -> list[str]:
        """The terms whose lexemes this reader does not know (all of them, once it knows too many)."""
        unknown = [t for t in dict.fromkeys(terms) if t not in self._lexemes]
        if len(self._lexemes) + len(unknown) > TERMS_KEPT:
            self._lexemes.clear()
            unknown = list(dict.fromkeys(terms))
        return unknown

    def _common_terms(self, terms: list[str]) -> set[str]:
        """The question's terms with a lexeme among the table's common ones (COMMON_LEXEMES, read again after
        TERMS_KNOWN_S); a term's lexemes are remembered (they never change), so most questions ask nothing."""
        now = time.monotonic()
        if now - self._common[1] >= TERMS_KNOWN_S:
            self._common = (frozenset(row[0] for row in self.connection.fetch(COMMON_LEXEMES, (RARE_SHARE,))), now)
        unknown = self._unknown_terms(terms)
        if unknown:
            self._lexemes.update((t, tuple(lexemes)) for t, lexemes in self.connection.fetch(LEXEMES, (unknown,)))
        common = self._common[0]
        return {t for t in terms if any(lexeme in common for lexeme in self._lexemes.get(t, ()))}

    def nearest_meanwhile(self, agent_id: str, question: Callable[[], Any],
                          generation: int | None) -> ByMeaning | None:
        """The search by meaning on a second connection (its session set for the index scan), in a thread
        while the first searches by keyword (with each row's distance, when the question was embedded
        first): the server runs both at once. Found rows come with their HIT columns, so none is read again."""
        if not self.vectors.extension:
            return None  # (the reader's exact search of its cached vectors)
        if self._search_db is None:
            settings = self.vectors.settings()
            self._search_db = self.connection.another("flink-memory recall by meaning", (PLAN_FOR_MEMORY, *settings))
        search_db = self._search_db
        bucket = self._bucket_of(agent_id)  # (remembered after an agent's first recall)

        def search() -> tuple[str, pgvector.Found]:
            vector = pgvector.text(question())
            return vector, self.connection.reach(search_db, lambda conn: self.vectors.nearest(
                conn, agent_id, vector, VECTOR_CANDIDATES, self._rows_of(conn, agent_id), bucket))

        searched = meanwhile(search, name="recall-by-meaning", started=False)  # (the keyword search goes first)

        def result(rows: Mapping[str, tuple[Any, ...]]) -> tuple[dict[str, float], dict[str, tuple[Any, ...]]]:
            vector, found = searched()
            nearest = {row[0]: row[:-1] for row in found}
            scored = [row for key, row in rows.items() if key not in nearest and len(row) > HIT_WIDTH]
            rest = [key for key, row in rows.items() if key not in nearest and len(row) == HIT_WIDTH]
            if rest:  # (keyword rows read before the question's vector was known)
                scored += self.connection.reach(
                    search_db, lambda conn: self.vectors.distances_of(conn, agent_id, vector, rest))
            return pgvector.cosines([*found, *scored]), nearest

        return result

    def _rows_of(self, conn: Any, agent_id: str) -> int:
        """The agent's rows up to EXACT_BELOW (its size class: pgvector.Vectors.rows_of), counted again after
        SIZE_KNOWN_S: an agent that grew past EXACT_BELOW meanwhile is still searched exactly, one that shrank
        falls back to it."""
        known = self._sizes.get(agent_id)
        now = time.monotonic()
        if known is None or now - known[1] >= pgvector.SIZE_KNOWN_S:
            if len(self._sizes) > TERMS_KEPT:
                self._sizes.clear()
            known = (self.vectors.rows_of(conn, agent_id), now)
            self._sizes[agent_id] = known
        return known[0]

    def close(self) -> None:
        if self._search_db is not None:
            self._search_db.close()
