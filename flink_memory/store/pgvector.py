"""pgvector on the PostgreSQL store: the extension, the column converted from bytes, the HNSW index, and
the search of one agent's nearest rows.

The index is HNSW over `vector::vector(dim)` with inner-product operators (the embedder's vectors are unit
length, so inner product orders them as cosine does, without a norm per comparison), split by agent into
BUCKETS partial indexes (`hashtext(agent_id) & 31`, the hash PostgreSQL's own hash indexes keep stable).
An HNSW scan filtered by agent reads candidates of every agent in its graph until it has enough of the
agent's: in one index over a million rows, an agent with a tenth of them needs about ten candidates per row
found (19 ms for 50 rows at 200 000 rows), in its bucket's index it owns most of the graph (3.5 ms). The
column itself is an untyped `vector`, so a store is created before its model is known; the indexes come
once the dimension is recorded. A recall asks for the agent's nearest rows by its bucket's index with the
agent as a filter (pgvector 0.8's iterative scan goes on past `hnsw.ef_search` until enough rows of the
agent are found), and for an agent of fewer than EXACT_BELOW rows exactly (its rows by the primary key,
sorted). Each row found comes with its inner product with the question, computed where the vectors are: a
row sends 8 bytes, not its vector.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from flink_memory.store.schema import BUCKET, BUCKETS, HIT, NODES

log = logging.getLogger(__name__)

INDEX = f"{NODES}_hnsw"  # INDEX_0 .. INDEX_31, one per bucket
COLUMN_TYPE = (f"SELECT t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = "
               f"to_regclass('{NODES}') AND a.attname = 'vector' AND NOT a.attisdropped")
VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
# (the bucket a literal: the planner matches it to the predicate of the bucket's partial index)
# (each row with its distance to the question last: the negative inner product, ordered by it)
NEAREST = (f"SELECT {HIT}, vector::vector({{dim}}) <#> %s::vector({{dim}}) AS distance FROM {NODES} WHERE agent_id = "
           f"%s AND vector IS NOT NULL AND {BUCKET} = {{bucket}} ORDER BY distance LIMIT %s")
# the same order on the column itself, which the index (on the cast to the dimension) does not serve
EXACT = (f"SELECT {HIT}, vector <#> %s::vector AS distance FROM {NODES} WHERE agent_id = %s AND vector IS NOT NULL "
         "ORDER BY distance LIMIT %s")
COUNT_UP_TO = f"SELECT count(*) FROM (SELECT 1 FROM {NODES} WHERE agent_id = %s LIMIT %s) r"
SIZE_KNOWN_S = 60.0  # how long a reader trusts an agent's size class (small: searched exactly)
EXACT_BELOW = 5000  # an agent with fewer rows is searched exactly (measured: docs/benchmarks.md)
# candidates of an index scan: at 1 000 000 rows (an agent of 100 000) 160 finds 90% of the exact top 5 of the
# static model's vectors in 6.5 ms (98% of e5's), 400 finds 94% in 12 ms, 1 000 99% in 23 ms (docs/benchmarks.md)
EF_SEARCH = 160
EF_SEARCH_NOT_ITERATIVE = 400
DISTANCES_OF = (f"SELECT node_id, vector <#> %s::vector FROM {NODES} WHERE agent_id = %s AND node_id = ANY(%s) "
                "AND vector IS NOT NULL")
# (found by a search: rows of the HIT columns, or the key alone, and the distance to the question last)
Found = list[tuple[Any, ...]]
# little-endian float32 bytes (the bytea column) as real[], for the one-time conversion of a store's column
FLOATS = """CREATE OR REPLACE FUNCTION pg_temp.flink_memory_floats(b bytea) RETURNS real[] LANGUAGE sql IMMUTABLE AS $$
  SELECT array_agg(CASE WHEN (w >> 23) & 255 = 0 THEN 0 ELSE (1 - 2 * (w >> 31))
                        * (1 + (w & 8388607)::float8 / 8388608) * 2::float8 ^ (((w >> 23) & 255) - 127) END::real
                   ORDER BY i)
  FROM (SELECT i, get_byte(b, 4 * i)::bigint | (get_byte(b, 4 * i + 1)::bigint << 8)
                  | (get_byte(b, 4 * i + 2)::bigint << 16) | (get_byte(b, 4 * i + 3)::bigint << 24) AS w
        FROM generate_series(0, length(b) / 4 - 1) i) words $$"""


def enable(conn: Any, location: str) -> bool:
    """Create the extension when the server has it and this user may; False (logged) otherwise."""
    import psycopg

    if conn.execute(VERSION).fetchone() is not None:
        return True
    if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone() is None:
        log.warning("%s: this PostgreSQL has no pgvector extension: vectors are kept as bytes and each reader "
                    "searches an agent's vectors in its own memory (install pgvector for an index)", location)
        return False
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the schema's transaction usable
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        log.warning("%s: cannot create the pgvector extension (%s): vectors are kept as bytes and searched in "
                    "each reader's memory; a superuser can run CREATE EXTENSION vector", location,
                    str(exc).strip())
        return False
    return True


def convert_bytes(conn: Any, location: str) -> None:
    """Turn a bytea vector column (a store written without the extension) into pgvector's type, once."""
    if conn.execute(COLUMN_TYPE).fetchone() != ("bytea",):
        return
    log.warning("%s: converting the stored vectors from bytes to pgvector's type (once)", location)
    conn.execute(FLOATS)
    conn.execute(f"ALTER TABLE {NODES} ALTER COLUMN vector TYPE vector "
                 "USING pg_temp.flink_memory_floats(vector)::vector")


def create_index(conn: Any, dim: int) -> None:
    """The HNSW index of each bucket for vectors of `dim` dimensions, unless it exists (checked first: CREATE
    INDEX IF NOT EXISTS would still wait for the table's writers)."""
    for bucket in range(BUCKETS):
        if conn.execute("SELECT to_regclass(%s)", (f"{INDEX}_{bucket}",)).fetchone()[0] is None:
            conn.execute(f"CREATE INDEX IF NOT EXISTS {INDEX}_{bucket} ON {NODES} USING hnsw "
                         f"((vector::vector({int(dim)})) vector_ip_ops) WHERE {BUCKET} = {bucket}")


def drop_index(conn: Any) -> None:
    for bucket in range(BUCKETS):
        conn.execute(f"DROP INDEX IF EXISTS {INDEX}_{bucket}")


def text(vector: Any) -> str:
    """pgvector's text form of a float32 vector (9 significant digits: the same float32 read back)."""
    return "[" + ",".join(f"{x:.9g}" for x in vector.tolist()) + "]"


def from_binary(data: bytes) -> Any:
    """A vector from pgvector's binary form: dimension and a spare (int16 each), then big-endian float32."""
    import numpy as np

    return np.frombuffer(data, dtype=">f4", offset=4)


@dataclass(frozen=True)
class Vectors:
    """How a store keeps its vectors: pgvector's column (`extension`), its scans iterative (0.8 and later)."""

    extension: bool
    iterative: bool = False

    @classmethod
    def of_store(cls, conn: Any) -> Vectors:
        if conn.execute(COLUMN_TYPE).fetchone() != ("vector",):
            return cls(extension=False)
        version = conn.execute(VERSION).fetchone()
        numbers = tuple(int(p) for p in version[0].split(".")[:2]) if version else (0, 0)
        return cls(extension=True, iterative=numbers >= (0, 8))

    def nearest(self, conn: Any, agent_id: str, question: str, nearest: int, rows: int, bucket: int) -> Found:
        """The agent's `nearest` rows closest to the question (`text` of a unit vector), on a connection with
        the search's session settings (`settings`); `rows`: the agent's rows up to EXACT_BELOW (`rows_of`),
        `bucket` its bucket.

        An agent with fewer than EXACT_BELOW rows is searched exactly (its rows by the primary key, sorted);
        a larger one by its bucket's HNSW index, and exactly after all when the index scan stopped short of
        `nearest` rows of the agent (its share of the bucket too small for the scan's bounds)."""
        found: Found = []
        if rows >= EXACT_BELOW:
            dim = question.count(",") + 1
            found = conn.execute(NEAREST.format(dim=dim, bucket=int(bucket)), (question, agent_id, nearest),
                                 prepare=True).fetchall()
        if len(found) < nearest:
            found = conn.execute(EXACT, (question, agent_id, nearest), prepare=True).fetchall()
        return found

    @staticmethod
    def rows_of(conn: Any, agent_id: str) -> int:
        """The agent's rows, counted up to EXACT_BELOW."""
        return int(conn.execute(COUNT_UP_TO, (agent_id, EXACT_BELOW), prepare=True).fetchone()[0])

    @staticmethod
    def distances_of(conn: Any, agent_id: str, question: str, keys: list[str]) -> Found:
        """The distances to the question of the agent's rows `keys` (those of them with a vector), as (key,
        distance) rows."""
        return conn.execute(DISTANCES_OF, (question, agent_id, keys), prepare=True).fetchall()

    def settings(self) -> list[str]:
        """The session settings of the connection that searches: EF_SEARCH candidates, then on by an iterative
        scan (pgvector 0.8; before it, a wider list: what it misses, the exact search makes up for); sorting
        off, so that the planner walks the index rather than sorting the agent's rows (an exact search has no
        index to walk and still sorts); and one plan kept per statement, prepared once: each of them has one
        good plan whatever the agent (the index's walk, or the agent's rows by its key), so planning it for
        each question (0.6 ms) is spared."""
        if self.iterative:
            scan = ["SET hnsw.iterative_scan = relaxed_order", f"SET hnsw.ef_search = {EF_SEARCH}"]
        else:
            scan = [f"SET hnsw.ef_search = {EF_SEARCH_NOT_ITERATIVE}"]
        return [*scan, "SET enable_sort = off", "SET plan_cache_mode = force_generic_plan"]


def cosines(found: Found) -> dict[str, float]:
    """Cosines of found rows (their key first, their distance to the unit question last) with the question:
    pgvector's inner product, in float32 (SQLite's are in float64: the two agree to about 1e-7)."""
    return {row[0]: -row[-1] for row in found if row[-1] is not None}
