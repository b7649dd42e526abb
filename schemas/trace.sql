-- dynaflow trace store, schema version 4 (PRAGMA user_version = 4).
--
-- One SQLite file holds one or more imported or captured traces. Times are
-- integer nanoseconds on the trace's clock; names are interned in `strings`
-- and referenced by id (0 is the empty string). A reader refuses a file whose
-- user_version it does not know. Changing a table is a new version; readers
-- keep reading the older ones.
--   version 1  the tables below without what is marked version 2 or 3
--   version 2  api_calls' synchronization columns (sync_device ...
--              wait_event_correlation), operators.collective_id, and
--              graph_id, graph_node of memcpy and memset
--   version 3  what an imported file carries beyond the analysis, so that
--              an export from the store equals one from the file:
--              devices.properties_json, processes.label, distributed_info,
--              operators' concrete_inputs_id and input_strides_id,
--              kernels.collective_id, every name of a thread; the launching
--              process (pid) of kernels, memcpy and memset; and process_meta,
--              the metadata of each traced process (meta keeps what holds
--              trace-wide)
--   version 4  operators.in_graph_capture
--
-- Natural queries go through the views at the end, e.g.
--   SELECT name, count(*), sum(dur_ns) FROM gpu_activity GROUP BY name ORDER BY 3 DESC;

PRAGMA user_version = 4;

-- Key/value facts about the trace: format, source files, tool versions,
-- and anything a tracer wants to record (dropped records, "no GPU", ...).
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

-- What one traced process recorded of itself (its rank, CUPTI status, exit
-- signal, module fingerprints...), one row per process and key; version 3.
-- A value every process of the trace shares is in meta as well.
CREATE TABLE process_meta (
  rank  INTEGER NOT NULL,
  pid   INTEGER NOT NULL,
  key   TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (rank, pid, key)
);

-- Kineto's distributedInfo of each rank as its file wrote it (a compact JSON
-- object, every field kept); version 3.
CREATE TABLE distributed_info (
  rank INTEGER PRIMARY KEY,
  json TEXT NOT NULL
);

CREATE TABLE strings (
  id    INTEGER PRIMARY KEY,
  value TEXT NOT NULL
);

-- One row per GPU, identified by (rank, device). 0 means "not known".
CREATE TABLE devices (
  id                    INTEGER PRIMARY KEY,   -- referenced by device_id columns
  rank                  INTEGER NOT NULL,
  device                INTEGER NOT NULL,
  name                  TEXT NOT NULL,
  sm_count              INTEGER NOT NULL,
  cc_major              INTEGER NOT NULL,
  cc_minor              INTEGER NOT NULL,
  memory_bytes          INTEGER NOT NULL,
  clock_khz             INTEGER NOT NULL,
  memory_bandwidth_gbps REAL NOT NULL,
  peak_tflops_fp32      REAL NOT NULL,
  peak_tflops_bf16      REAL NOT NULL,
  peak_tflops_fp8       REAL NOT NULL,
  -- The device's entry of Kineto's deviceProperties as the file wrote it (a
  -- compact JSON object) or '' when none (version 3).
  properties_json       TEXT NOT NULL DEFAULT '',
  UNIQUE (rank, device)
);

CREATE TABLE processes (
  rank  INTEGER NOT NULL,
  pid   INTEGER NOT NULL,
  name  TEXT NOT NULL,
  label TEXT NOT NULL DEFAULT '',  -- Kineto's process_labels ("CPU", "GPU 0"); version 3
  PRIMARY KEY (rank, pid)
);

-- A thread named twice (Kineto files rename pt_main_thread to pt_autograd_0)
-- has a row per name, in the order read (rowid); version 3, keyed by
-- (rank, pid, tid) before.
CREATE TABLE threads (
  rank INTEGER NOT NULL,
  pid  INTEGER NOT NULL,
  tid  INTEGER NOT NULL,
  name TEXT NOT NULL,
  PRIMARY KEY (rank, pid, tid, name)
);

-- Kernels as they ran. correlation links to api_calls.correlation of the same
-- rank; external_id links to operators.external_id of the same rank. pid is
-- the host process that launched the work (version 3), NULL when the source
-- does not say (Kineto files name the device instead).
CREATE TABLE kernels (
  device_id     INTEGER NOT NULL REFERENCES devices(id),
  stream        INTEGER NOT NULL,
  start_ns      INTEGER NOT NULL,
  end_ns        INTEGER NOT NULL,
  name_id       INTEGER NOT NULL REFERENCES strings(id),
  correlation   INTEGER,
  external_id   INTEGER,
  grid_x        INTEGER NOT NULL, grid_y  INTEGER NOT NULL, grid_z  INTEGER NOT NULL,
  block_x       INTEGER NOT NULL, block_y INTEGER NOT NULL, block_z INTEGER NOT NULL,
  registers     INTEGER NOT NULL,
  shared_memory INTEGER NOT NULL,
  graph_id      INTEGER,                      -- CUDA graph, NULL outside graphs
  graph_node    INTEGER,
  pid           INTEGER,                      -- version 3
  -- NCCL collective metadata of the kernel as operators.collective; version 3
  collective_id INTEGER NOT NULL DEFAULT 0 REFERENCES strings(id)
);

CREATE TABLE memcpy (
  device_id   INTEGER NOT NULL REFERENCES devices(id),
  stream      INTEGER NOT NULL,
  start_ns    INTEGER NOT NULL,
  end_ns      INTEGER NOT NULL,
  name_id     INTEGER NOT NULL REFERENCES strings(id),
  copy_kind   TEXT NOT NULL,                  -- HtoD, DtoH, DtoD, PtoP, ...
  bytes       INTEGER NOT NULL,
  correlation INTEGER,
  external_id INTEGER,
  graph_id    INTEGER,                        -- as kernels'; version 2
  graph_node  INTEGER,                        -- version 2
  pid         INTEGER                         -- as kernels'; version 3
);

CREATE TABLE memset (
  device_id   INTEGER NOT NULL REFERENCES devices(id),
  stream      INTEGER NOT NULL,
  start_ns    INTEGER NOT NULL,
  end_ns      INTEGER NOT NULL,
  name_id     INTEGER NOT NULL REFERENCES strings(id),
  bytes       INTEGER NOT NULL,
  correlation INTEGER,
  external_id INTEGER,
  graph_id    INTEGER,                        -- as kernels'; version 2
  graph_node  INTEGER,                        -- version 2
  pid         INTEGER                         -- as kernels'; version 3
);

-- CUDA runtime and driver calls, and synchronization (kind). Synchronization
-- rows name the device and stream they synchronize and, for event waits
-- (cudaStreamWaitEvent, cudaEventSynchronize), the event, the stream it was
-- last recorded on before the wait and that cudaEventRecord's correlation id:
-- a wait on stream B for an event recorded on stream A orders B's later work
-- after A's earlier work. NULL when not known or not applicable.
CREATE TABLE api_calls (
  rank        INTEGER NOT NULL,
  pid         INTEGER NOT NULL,
  tid         INTEGER NOT NULL,
  kind        TEXT NOT NULL CHECK (kind IN ('runtime', 'driver', 'sync')),
  start_ns    INTEGER NOT NULL,
  end_ns      INTEGER NOT NULL,
  name_id     INTEGER NOT NULL REFERENCES strings(id),
  correlation INTEGER,
  external_id INTEGER,
  sync_device INTEGER,                        -- version 2
  sync_stream INTEGER,                        -- version 2
  wait_on_stream INTEGER,                     -- version 2
  wait_event_id INTEGER,                      -- version 2
  wait_event_correlation INTEGER              -- version 2
);

-- Annotated ranges: user annotations on host threads, their projection on a
-- device (device_id not NULL, e.g. ProfilerStep#N), and NVTX ranges.
CREATE TABLE ranges (
  rank      INTEGER NOT NULL,
  pid       INTEGER NOT NULL,
  tid       INTEGER NOT NULL,
  device_id INTEGER REFERENCES devices(id),
  domain    TEXT NOT NULL CHECK (domain IN ('user', 'gpu_user', 'nvtx')),
  start_ns  INTEGER NOT NULL,
  end_ns    INTEGER NOT NULL,
  name_id   INTEGER NOT NULL REFERENCES strings(id)
);

-- Framework operators. input_shapes and input_types are compact JSON arrays.
-- collective: c10d/NCCL metadata of record_param_comms as the members of a
-- compact JSON object without braces, Kineto's names ("Collective name":
-- "allreduce","Process Group Name":"0","In msg nelems":1024, ...); 0 (the
-- empty string) for other operators. in_graph_capture: 1 when the operator
-- began while its thread captured CUDA work into a graph (stream capture):
-- its launches were recorded, not run, so it has no GPU time of its own; each
-- replay of the graph, whose kernels link to it, is one execution of it. 0
-- where the source cannot tell (a tracer without CUPTI's callback
-- subscription, other tools' files).
CREATE TABLE operators (
  rank           INTEGER NOT NULL,
  pid            INTEGER NOT NULL,
  tid            INTEGER NOT NULL,
  start_ns       INTEGER NOT NULL,
  end_ns         INTEGER NOT NULL,
  name_id        INTEGER NOT NULL REFERENCES strings(id),
  sequence       INTEGER,                     -- autograd sequence number
  pass           TEXT NOT NULL CHECK (pass IN ('unknown', 'forward', 'backward')),
  input_shapes_id INTEGER NOT NULL REFERENCES strings(id),
  input_types_id  INTEGER NOT NULL REFERENCES strings(id),
  module_path_id  INTEGER NOT NULL REFERENCES strings(id),
  external_id    INTEGER,
  collective_id  INTEGER NOT NULL DEFAULT 0 REFERENCES strings(id), -- version 2
  -- Kineto's "Concrete Inputs" and "Input Strides" as compact JSON (version 3)
  concrete_inputs_id INTEGER NOT NULL DEFAULT 0 REFERENCES strings(id),
  input_strides_id   INTEGER NOT NULL DEFAULT 0 REFERENCES strings(id),
  in_graph_capture   INTEGER NOT NULL DEFAULT 0 CHECK (in_graph_capture IN (0, 1)) -- version 4
);

-- Malformed or skipped input, counted by named category (never fatal).
CREATE TABLE import_stats (
  name        TEXT PRIMARY KEY,
  severity    TEXT NOT NULL CHECK (severity IN ('info', 'data_loss', 'error')),
  count       INTEGER NOT NULL,
  description TEXT NOT NULL
);

-- Every GPU activity in one place, with names resolved.
CREATE VIEW gpu_activity AS
  SELECT 'kernel' AS kind, d.rank, d.device, k.stream, k.start_ns, k.end_ns,
         k.end_ns - k.start_ns AS dur_ns, s.value AS name, 0 AS bytes,
         k.correlation, k.external_id
    FROM kernels k JOIN devices d ON d.id = k.device_id JOIN strings s ON s.id = k.name_id
  UNION ALL
  SELECT 'memcpy', d.rank, d.device, m.stream, m.start_ns, m.end_ns,
         m.end_ns - m.start_ns, s.value, m.bytes, m.correlation, m.external_id
    FROM memcpy m JOIN devices d ON d.id = m.device_id JOIN strings s ON s.id = m.name_id
  UNION ALL
  SELECT 'memset', d.rank, d.device, m.stream, m.start_ns, m.end_ns,
         m.end_ns - m.start_ns, s.value, m.bytes, m.correlation, m.external_id
    FROM memset m JOIN devices d ON d.id = m.device_id JOIN strings s ON s.id = m.name_id;

CREATE VIEW operators_named AS
  SELECT o.rank, o.pid, o.tid, o.start_ns, o.end_ns, o.end_ns - o.start_ns AS dur_ns,
         n.value AS name, o.sequence, o.pass, sh.value AS input_shapes,
         ty.value AS input_types, mp.value AS module_path, o.external_id,
         co.value AS collective, o.in_graph_capture
    FROM operators o
    JOIN strings n ON n.id = o.name_id
    JOIN strings sh ON sh.id = o.input_shapes_id
    JOIN strings ty ON ty.id = o.input_types_id
    JOIN strings mp ON mp.id = o.module_path_id
    JOIN strings co ON co.id = o.collective_id;

-- Which operator launched which GPU work (Kineto's External id).
CREATE VIEW operator_gpu_links AS
  SELECT o.rank, o.name, o.module_path, o.external_id, g.kind, g.device, g.stream,
         g.name AS gpu_name, g.start_ns, g.end_ns
    FROM operators_named o
    JOIN gpu_activity g ON g.rank = o.rank AND g.external_id = o.external_id
   WHERE o.external_id IS NOT NULL;

CREATE VIEW api_calls_named AS
  SELECT a.rank, a.pid, a.tid, a.kind, a.start_ns, a.end_ns, a.end_ns - a.start_ns AS dur_ns,
         s.value AS name, a.correlation, a.external_id, a.sync_device, a.sync_stream,
         a.wait_on_stream, a.wait_event_id, a.wait_event_correlation
    FROM api_calls a JOIN strings s ON s.id = a.name_id;

CREATE VIEW ranges_named AS
  SELECT r.rank, r.pid, r.tid, d.device, r.domain, r.start_ns, r.end_ns,
         r.end_ns - r.start_ns AS dur_ns, s.value AS name
    FROM ranges r JOIN strings s ON s.id = r.name_id LEFT JOIN devices d ON d.id = r.device_id;
