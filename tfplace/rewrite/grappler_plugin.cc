// tfplace's rewrite as a custom Grappler optimizer, registered as "tfplace".
//
// Built by tfplace.rewrite.grappler.build_plugin() against the installed TensorFlow's headers and
// loaded with tf.load_library; tfplace.rewrite.grappler.session_config() enables it. The rewrite
// itself stays in Python (tfplace.rewrite.graph_rewrite): Optimize() takes the GIL, calls
// tfplace.rewrite.grappler_entry.optimize(graph_bytes, fetches, params, item_id) and parses the
// GraphDef it returns (None: not the training step, e.g. a function body: keep the graph). Only
// serialized protobufs cross the boundary.
//
// Failures fail closed: TensorFlow logs an optimizer's error and runs the original graph (on one
// device, even with fail_on_optimizer_errors: checked with TF 2.15.1), so a failed rewrite returns
// the original graph with an Assert (condition false, the error as its message) as a control input
// of every fetched node: the session's run raises InvalidArgumentError carrying the reason.

#include <Python.h>

#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

namespace tensorflow {
namespace grappler {
namespace {

constexpr char kEntryModule[] = "tfplace.rewrite.grappler_entry";
constexpr char kFailedNode[] = "tfplace/rewrite_failed";

// Owns one Python reference.
class PyRef {
 public:
  explicit PyRef(PyObject* obj = nullptr) : obj_(obj) {}
  ~PyRef() { Py_XDECREF(obj_); }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyObject* get() const { return obj_; }
  explicit operator bool() const { return obj_ != nullptr; }

 private:
  PyObject* obj_;
};

// The pending Python exception as "Type: message" (and clears it).
std::string TakePythonError() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  PyRef t(type), v(value), tb(trace);
  std::string out = "unknown Python error";
  if (v) {
    PyRef text(PyObject_Str(v.get()));
    const char* utf8 = text ? PyUnicode_AsUTF8(text.get()) : nullptr;
    const char* name = t ? reinterpret_cast<PyTypeObject*>(t.get())->tp_name : "Exception";
    if (utf8 != nullptr) out = std::string(name) + ": " + utf8;
  }
  PyErr_Clear();
  return out;
}

// Calls grappler_entry.optimize. Returns "" and sets *graph (and *rewritten) on success, else the
// error. The caller holds the GIL.
std::string CallEntry(const std::string& item_id, const std::string& graph_bytes,
                      const std::vector<string>& fetches,
                      const std::vector<std::pair<string, string>>& params, std::string* graph,
                      bool* rewritten) {
  PyRef module(PyImport_ImportModule(kEntryModule));
  if (!module) return "cannot import " + std::string(kEntryModule) + ": " + TakePythonError();
  PyRef fn(PyObject_GetAttrString(module.get(), "optimize"));
  PyRef arg_graph(PyBytes_FromStringAndSize(graph_bytes.data(), graph_bytes.size()));
  PyRef arg_fetch(PyList_New(0));
  PyRef arg_params(PyDict_New());
  PyRef arg_id(PyUnicode_FromStringAndSize(item_id.data(), item_id.size()));
  if (!fn || !arg_graph || !arg_fetch || !arg_params || !arg_id) return TakePythonError();
  for (const string& f : fetches) {
    PyRef s(PyUnicode_FromStringAndSize(f.data(), f.size()));
    if (!s || PyList_Append(arg_fetch.get(), s.get()) != 0) return TakePythonError();
  }
  for (const auto& kv : params) {
    PyRef v(PyUnicode_FromStringAndSize(kv.second.data(), kv.second.size()));
    if (!v || PyDict_SetItemString(arg_params.get(), kv.first.c_str(), v.get()) != 0) {
      return TakePythonError();
    }
  }
  PyRef result(PyObject_CallFunctionObjArgs(fn.get(), arg_graph.get(), arg_fetch.get(), arg_params.get(),
                                            arg_id.get(), nullptr));
  if (!result) return TakePythonError();
  if (result.get() == Py_None) {
    *rewritten = false;
    return "";
  }
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(result.get(), &data, &size) != 0) return TakePythonError();
  graph->assign(data, size);
  *rewritten = true;
  return "";
}

// `graph` with an always-failing Assert carrying `message` before every fetched node. Its nodes go
// on a CPU device of the graph (Grappler's output is not placed again; Assert runs on the host).
void FailClosed(const GraphDef& graph, const std::vector<string>& fetches, const std::string& message,
                GraphDef* out) {
  *out = graph;
  std::string device;
  for (const NodeDef& node : graph.node()) {
    if (device.empty() || node.device().find("device:CPU:") != std::string::npos) device = node.device();
    if (device.find("device:CPU:") != std::string::npos) break;
  }
  NodeDef* cond = out->add_node();
  cond->set_name(std::string(kFailedNode) + "/condition");
  cond->set_device(device);
  cond->set_op("Const");
  (*cond->mutable_attr())["dtype"].set_type(DT_BOOL);
  TensorProto* cond_value = (*cond->mutable_attr())["value"].mutable_tensor();
  cond_value->set_dtype(DT_BOOL);
  cond_value->mutable_tensor_shape();
  cond_value->add_bool_val(false);
  NodeDef* text = out->add_node();
  text->set_name(std::string(kFailedNode) + "/message");
  text->set_device(device);
  text->set_op("Const");
  (*text->mutable_attr())["dtype"].set_type(DT_STRING);
  TensorProto* text_value = (*text->mutable_attr())["value"].mutable_tensor();
  text_value->set_dtype(DT_STRING);
  text_value->mutable_tensor_shape();
  text_value->add_string_val("tfplace Grappler plugin: the rewrite failed: " + message);
  NodeDef* assert_node = out->add_node();
  assert_node->set_name(kFailedNode);
  assert_node->set_device(device);
  assert_node->set_op("Assert");
  assert_node->add_input(cond->name());
  assert_node->add_input(text->name());
  (*assert_node->mutable_attr())["T"].mutable_list()->add_type(DT_STRING);
  (*assert_node->mutable_attr())["summarize"].set_i(1);
  for (const string& fetch : fetches) {
    const string op = fetch.substr(0, fetch.find(':'));
    for (NodeDef& node : *out->mutable_node()) {
      if (node.name() == op) node.add_input("^" + std::string(kFailedNode));
    }
  }
}

class TfplaceOptimizer : public CustomGraphOptimizer {
 public:
  string name() const override { return "tfplace"; }
  bool UsesFunctionLibrary() const override { return false; }

  Status Init(const RewriterConfig_CustomGraphOptimizer* config) override {
    params_.clear();
    init_error_.clear();
    if (config == nullptr) return OkStatus();
    for (const auto& kv : config->parameter_map()) {
      if (kv.second.value_case() != AttrValue::kS) {
        init_error_ = "parameter " + kv.first + " must be a string (AttrValue.s)";
      }
      params_.emplace_back(kv.first, kv.second.s());
    }
    return OkStatus();
  }

  Status Optimize(Cluster* /*cluster*/, const GrapplerItem& item, GraphDef* optimized_graph) override {
    std::string error = init_error_;
    std::string rewritten_bytes;
    bool rewritten = false;
    if (error.empty() && !Py_IsInitialized()) error = "no Python interpreter in this process";
    if (error.empty()) {
      std::string graph_bytes;
      item.graph.SerializeToString(&graph_bytes);
      PyGILState_STATE gil = PyGILState_Ensure();
      error = CallEntry(item.id, graph_bytes, item.fetch, params_, &rewritten_bytes, &rewritten);
      PyGILState_Release(gil);
    }
    if (error.empty() && !rewritten) {
      *optimized_graph = item.graph;  // not a training step (e.g. a function body): unchanged
      return OkStatus();
    }
    if (error.empty() && !optimized_graph->ParseFromString(rewritten_bytes)) {
      error = "the rewritten GraphDef did not parse";
    }
    if (!error.empty()) FailClosed(item.graph, item.fetch, error, optimized_graph);
    return OkStatus();
  }

 private:
  std::vector<std::pair<string, string>> params_;
  std::string init_error_;
};

}  // namespace

REGISTER_GRAPH_OPTIMIZER_AS(TfplaceOptimizer, "tfplace");

}  // namespace grappler
}  // namespace tensorflow
