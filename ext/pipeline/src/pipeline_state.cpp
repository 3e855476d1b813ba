// ext/pipeline/src/pipeline_state.cpp: the state a Pipeline carries between runs (docs/deploy.md, "State").
//
// An edge with `state: true` goes from a node's update output to its own state input. The pipeline owns one
// buffer per state, in the caller's memory kind, holding what the next run reads: run() binds the node's state
// input to it (so the caller passes external inputs only) and, once every node ran, copies the update into it
// (on the stream: inside a step's CUDA graph too, so a graphed step carries state like one run node by node).
// The update is written to a buffer of its own first, so a run that fails leaves the state as it was, and no
// state buffer is ever a caller's.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>

#include "initial_values.h"
#include "pipeline_internal.h"
#include "pyrepr.h"
#include "tensor_info.h"

namespace leapp {

using namespace pipeline_detail;

void Pipeline::Impl::open_states() {
  std::vector<StateValue> read = read_initial_values(description);
  for (size_t s = 0; s < read.size(); ++s) {
    StateValue& v = read[s];
    State state;
    state.info = tensor_info(v.spec);
    state.info.name = v.key;
    state.node = int(v.node);
    state.output = v.output;
    state.initial = std::move(v.bytes);
    const size_t bytes = state.info.byte_size();
    state.buffer.bytes = bytes;
    if (options.memory == Memory::kDevice) {
      LEAPP_CHECK_CU(driver().cuMemAlloc(&state.buffer.device, std::max<size_t>(bytes, 1)));
    } else {
      try {
        state.buffer.host.resize((bytes + 7) / 8 + 1);
      } catch (const std::bad_alloc&) {
        throw PipelineError("pipeline '" + description.name + "': cannot allocate " + std::to_string(bytes) +
                            " bytes for its state " + repr_str(v.key) + " (" + spec_text(state.info) + "): out of memory");
      }
    }
    StateInfo info;
    static_cast<TensorInfo&>(info) = state.info;
    info.node = description.nodes[v.node].name;
    info.input = v.input;
    info.output = v.output;
    state_infos.push_back(std::move(info));
    states.push_back(std::move(state));
    Node& node = nodes[v.node];
    const auto& inputs = node.info.inputs;
    const size_t i = size_t(std::find_if(inputs.begin(), inputs.end(), [&](const TensorInfo& t) { return t.name == v.input; }) -
                            inputs.begin());
    node.sources[i] = {kStateSource, v.key};
    node.state_of.resize(inputs.size());
    node.state_of[i] = s;
  }
  for (State& state : states) copy(state.buffer.data(), state.initial.data(), state.initial.size(), true);
}

void Pipeline::Impl::carry_states() {
  for (State& state : states)
    copy(state.buffer.data(), values.at({state.node, state.output}).data(), state.buffer.bytes);
}

State& Pipeline::Impl::state_named(const std::string& name, const char* call) {
  for (State& state : states)
    if (state.info.name == name) return state;
  std::vector<std::string> names;
  for (const State& state : states) names.push_back(state.info.name);
  throw PipelineError("Pipeline '" + description.name + "': " + call + ": " + repr_str(name) +
                      " is no state of the pipeline (states: " + repr_names(names) + ")");
}

const std::vector<StateInfo>& Pipeline::state_infos() const { return impl_->state_infos; }

const void* Pipeline::state(const std::string& name) const { return impl_->state_named(name, "state(name)").buffer.data(); }

void Pipeline::reset() {
  std::lock_guard<std::mutex> one_at_a_time(impl_->calls);
  impl_->make_current();
  for (State& state : impl_->states) impl_->copy(state.buffer.data(), state.initial.data(), state.initial.size(), true);
}

void Pipeline::reset(const std::map<std::string, const void*>& values) {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> one_at_a_time(p.calls);
  if (p.states.empty() && !values.empty())
    throw PipelineError("Pipeline '" + p.description.name + "': reset(state): the pipeline has no state");
  std::vector<std::pair<State*, const void*>> chosen;  // every name checked before anything is copied
  for (const auto& [name, buffer] : values) {
    State& state = p.state_named(name, "reset(state)");
    if (buffer == nullptr)
      throw PipelineError("Pipeline '" + p.description.name + "': reset(state): " + repr_str(name) + " has no buffer (null)");
    chosen.emplace_back(&state, buffer);
  }
  p.make_current();
  for (const auto& [state, buffer] : chosen) p.copy(state->buffer.data(), buffer, state->buffer.bytes);
}

}  // namespace leapp
