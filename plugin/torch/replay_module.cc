// _dynaflow_replay: the C++ side of apply's planned calls
// (plugin/python/dynaflow/_apply.py, _graphs.py): ReplayStep's copies and
// ModuleSnapshot's comparison, the per-call work of a replay from a CUDA
// graph that Python would do tensor by tensor and attribute by attribute;
// CallSplitter, the walk of an eager planned call's arguments into its
// micro-batches' (_split.py); CallKeys, the walks that key a planned call
// (_rows.audit_key, _graphs.flatten_inputs); ModuleState, what such a call must leave
// unchanged in its modules (_split.py); UnitWalk and global_modes, what it
// checks of its unit's modules and of torch's settings (_split.check_module,
// _graphs._global_modes); CallerState, the caller's torch state carried
// into each micro-batch; and RegionTurns, the boundaries of a region call
// (_apply._Region).
//
// pybind11 with torch's type casters (torch/csrc/utils/pybind.h): a list of
// tensors crosses as std::vector<at::Tensor> without copying any data. A C++
// exception reaches Python as RuntimeError (c10::Error, std::runtime_error)
// or ValueError (std::invalid_argument).
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/utils/pybind.h>

#include "plugin/torch/call_guards.h"
#include "plugin/torch/call_keys.h"
#include "plugin/torch/call_split.h"
#include "plugin/torch/module_snapshot.h"
#include "plugin/torch/module_state.h"
#include "plugin/torch/region_turns.h"
#include "plugin/torch/replay_step.h"

namespace py = pybind11;

namespace {

// The region call (RegionTurns::serial, 0 for none) and micro-batch this
// thread runs, from a successful begin to its end: the stage modules'
// pre-hook turns only there.
thread_local uint64_t bound_region = 0;
thread_local int bound_micro_batch = 0;

void Check(const dynaflow::Status& status) {
  if (!status.ok()) throw std::runtime_error("dynaflow apply: " + status.message());
}

// A function of libdynaflow_apply, from its address as ctypes gives it.
template <typename Fn>
Fn AbiFunction(uintptr_t address, const char* name) {
  if (address == 0) throw std::invalid_argument(std::string("no address for ") + name);
  return reinterpret_cast<Fn>(address);
}

}  // namespace

PYBIND11_MODULE(_dynaflow_replay, m) {
  m.doc() = "dynaflow: the per-call work of a planned call replayed from a CUDA graph";

  // The copies run without the GIL, as torch's own operators do (the
  // arguments are converted before, the result after).
  using no_gil = py::call_guard<py::gil_scoped_release>;
  py::class_<dynaflow::ReplayStep>(m, "ReplayStep")
      .def(py::init<std::vector<at::Tensor>, std::vector<int64_t>, int64_t>(),
           py::arg("inputs"), py::arg("flags"), py::arg("padded"))
      .def_readonly_static("ROWS", &dynaflow::ReplayStep::kRows)
      .def_readonly_static("BOUND", &dynaflow::ReplayStep::kBound)
      .def("set_outputs", &dynaflow::ReplayStep::SetOutputs, py::arg("outputs"))
      .def("copy_in", &dynaflow::ReplayStep::CopyIn, py::arg("leaves"), py::arg("rows"),
           no_gil())
      .def("copy_out", &dynaflow::ReplayStep::CopyOut, py::arg("rows"), no_gil())
      .def_property_readonly("padded", &dynaflow::ReplayStep::padded);

  py::class_<dynaflow::TypeKinds>(m, "TypeKinds")
      .def(py::init<py::object>(), py::arg("kind_of"))
      .def("of", [](dynaflow::TypeKinds& k, py::handle v) { return static_cast<int>(k.Of(v.ptr())); },
           py::arg("value"));

  py::class_<dynaflow::ModuleSnapshot>(m, "ModuleSnapshot")
      .def(py::init<const py::sequence&, dynaflow::TypeKinds*, py::object>(),
           py::arg("modules"), py::arg("kinds").none(false), py::arg("tables"),
           py::keep_alive<1, 3>())  // the snapshot keeps its TypeKinds
      .def("same", &dynaflow::ModuleSnapshot::Same, py::arg("modules"))
      .def_property_readonly("objects", &dynaflow::ModuleSnapshot::objects)
      .def_property_readonly("tensors", &dynaflow::ModuleSnapshot::tensors);

  py::class_<dynaflow::CallSplitter>(m, "CallSplitter")
      .def(py::init<py::tuple, py::frozenset>(), py::arg("immutable_types"),
           py::arg("shared_names"))
      .def("split", &dynaflow::CallSplitter::Split, py::arg("splitter"), py::arg("names"),
           py::arg("args"), py::arg("kwargs"))
      .def("merge", &dynaflow::CallSplitter::Merge, py::arg("split"), py::arg("results"),
           py::arg("view_owner"), py::arg("fallback"));

  py::class_<dynaflow::CallKeys>(m, "CallKeys")
      .def(py::init<py::tuple, py::tuple>(), py::arg("immutable_types"), py::arg("kept_types"))
      .def("audit_key", &dynaflow::CallKeys::AuditKey, py::arg("key"), py::arg("args"),
           py::arg("kwargs"), py::arg("batch"), py::arg("fallback"))
      .def("flatten", &dynaflow::CallKeys::Flatten, py::arg("flattening"), py::arg("args"),
           py::arg("kwargs"));

  py::class_<dynaflow::UnitWalk>(m, "UnitWalk")
      .def(py::init<py::object, py::tuple>(), py::arg("module_type"), py::arg("flagged_types"))
      .def("walk", &dynaflow::UnitWalk::Walk, py::arg("unit"));
  m.def("global_modes", &dynaflow::GlobalModes);

  py::class_<dynaflow::ModuleState>(m, "ModuleState")
      .def(py::init<const py::sequence&, py::frozenset, py::object>(), py::arg("modules"),
           py::arg("tables"), py::arg("unchanged"))
      .def("check", &dynaflow::ModuleState::Check)
      .def_property_readonly("attributes", &dynaflow::ModuleState::attributes)
      .def_property_readonly("tensors", &dynaflow::ModuleState::tensors);

  // A region's boundaries (plugin/torch/region_turns.h). The sequencer's
  // functions come as the addresses ctypes found in libdynaflow_apply, so
  // both sides turn one region. Waiting for a turn releases the GIL, or the
  // micro-batch that holds the turn could not reach its next boundary.
  using dynaflow::RegionAbi;
  using dynaflow::RegionTurns;
  py::class_<RegionTurns>(m, "RegionTurns")
      .def(py::init([](uintptr_t region, uintptr_t turn, uintptr_t edges, uintptr_t reset,
                       uintptr_t finish, const std::vector<std::tuple<int, int, int>>& tasks,
                       bool staggered, std::optional<c10::Device> device) {
             RegionAbi abi;
             abi.region = reinterpret_cast<void*>(region);
             abi.turn = AbiFunction<decltype(abi.turn)>(turn, "the region turn");
             abi.edges = AbiFunction<decltype(abi.edges)>(edges, "the region edges");
             abi.reset = AbiFunction<decltype(abi.reset)>(reset, "the region reset");
             abi.finish = AbiFunction<decltype(abi.finish)>(finish, "the region finish");
             std::vector<RegionTurns::Task> schedule;
             for (const auto& [segment, micro_batch, stream] : tasks) {
               schedule.push_back({segment, micro_batch, stream});
             }
             auto turns = std::make_unique<RegionTurns>(abi, std::move(schedule), staggered, device);
             if (!turns->status().ok()) throw std::invalid_argument(turns->status().message());
             return turns;
           }),
           py::arg("region"), py::arg("turn"), py::arg("edges"), py::arg("reset"),
           py::arg("finish"), py::arg("tasks"), py::arg("staggered"), py::arg("device"))
      .def(
          "start_call",
          [](RegionTurns& turns, bool inline_call, std::optional<c10::Stream> caller) {
            Check(turns.StartCall(inline_call, caller));
          },
          py::arg("inline"), py::arg("caller"))
      .def(
          "begin",
          [](RegionTurns& turns, int mb) {
            {
              py::gil_scoped_release released;
              Check(turns.Begin(mb));
            }
            bound_region = turns.serial();
            bound_micro_batch = mb;
          },
          py::arg("mb"))
      .def(
          "end",
          [](RegionTurns& turns, int mb) {
            bound_region = 0;
            Check(turns.End(mb));
          },
          py::arg("mb"))
      // The forward pre-hook of every stage module: a boundary where this
      // thread runs a micro-batch of this region, nothing elsewhere.
      .def(
          "stage_hook",
          [](RegionTurns& turns, py::handle /*module*/, py::handle /*args*/) {
            if (bound_region != turns.serial()) return;
            py::gil_scoped_release released;
            Check(turns.Stage(bound_micro_batch));
          },
          py::arg("module"), py::arg("args"))
      .def(
          "boundary",
          [](RegionTurns& turns, int mb) {
            py::gil_scoped_release released;
            Check(turns.Boundary(mb));
          },
          py::arg("mb"))
      .def(
          "end_call",
          [](RegionTurns& turns, std::optional<c10::Stream> caller) {
            Check(turns.EndCall(caller));
          },
          py::arg("caller"))
      .def("detach", &RegionTurns::Detach)
      .def_property_readonly("inline", &RegionTurns::inline_call)
      .def_property_readonly("issued", &RegionTurns::issued)
      .def_property_readonly("extra", &RegionTurns::extra);

  // The calling thread's torch state, captured where a planned call starts:
  // grad and inference mode, autocast, torch function and dispatch modes,
  // saved-tensor hooks, functorch transforms, the profiler's thread-local
  // callbacks (at::ThreadLocalState, which torch itself carries into its
  // autograd and at::launch threads). run(fn) calls fn with that state set
  // and puts the thread's own back afterwards, whatever thread runs it: a
  // micro-batch on the runtime's worker computes what the caller's thread
  // would have.
  py::class_<at::ThreadLocalState>(m, "CallerState")
      .def(py::init<>())
      .def(
          "run",
          [](const at::ThreadLocalState& state, const py::function& fn) {
            at::ThreadLocalStateGuard guard(state);
            return fn();
          },
          py::arg("fn"));
}
