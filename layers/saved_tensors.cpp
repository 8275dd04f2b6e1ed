#include "layers/saved_tensors.hpp"

#include <algorithm>

#include "devices/errors.hpp"

namespace nodeemu::layers {

std::vector<SavedTensors::Entry>::iterator SavedTensors::find(const std::string& module,
                                                              const std::string& name) {
  return std::find_if(saved_.begin(), saved_.end(),
                      [&](const Entry& e) { return e.name == name && e.module == module; });
}

void SavedTensors::save(const std::string& module, const std::string& name, Tensor t, Stream& s) {
  if (hooks_) hooks_->tensor_saved({this->module(module), name}, t, s);
  auto it = find(module, name);
  if (it != saved_.end())
    it->tensor = std::move(t);
  else
    saved_.push_back({module, name, std::move(t)});
}

Tensor SavedTensors::need(const std::string& module, const std::string& name, Stream& s) {
  auto it = find(module, name);
  if (it == saved_.end())
    throw UsageError("layer " + std::to_string(layer_) + ", micro-batch " +
                     std::to_string(microbatch_) + ": backward needs " + module + "." + name +
                     ", which forward did not save or backward already released; run each "
                     "node's forward once before its backward");
  if (hooks_) hooks_->tensor_needed({this->module(module), name}, it->tensor, s);
  return it->tensor;
}

void SavedTensors::release(const std::string& module, const std::string& name) {
  auto it = find(module, name);
  if (it == saved_.end()) return;
  saved_.erase(it);
  if (hooks_) hooks_->tensor_released({this->module(module), name});
}

void SavedTensors::start_module(const std::string& name, Stream& s) {
  if (hooks_) hooks_->module_start(module(name), s);
}

void SavedTensors::end_module(const std::string& name, Stream& s) {
  if (hooks_) hooks_->module_end(module(name), s);
}

void SavedTensors::backward_start(const std::string& name, Stream& s) {
  if (hooks_) hooks_->module_backward_start(module(name), s);
}

void SavedTensors::backward_end(const std::string& name, Stream& s) {
  if (hooks_) hooks_->module_backward_end(module(name), s);
}

ModuleScope::ModuleScope(SavedTensors& saved, const std::string& module, Stream& s)
    : saved_(saved), id_(saved.module(module)), stream_(s) {
  if (saved_.hooks()) saved_.hooks()->module_start(id_, stream_);
}

ModuleScope::~ModuleScope() {
  if (saved_.hooks()) saved_.hooks()->module_end(id_, stream_);
}

}  // namespace nodeemu::layers
