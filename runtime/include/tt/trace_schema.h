// The TT_TRACE file format (docs/runtime/trace.md): event names and field
// keys, shared by the runtime's writer (src/trace.cpp) and tensor-tidy
// --verify's reader (tool/verify/Trace.cpp). Header-only, no dependencies.
// Bump kVersion when a field changes meaning or disappears; the first line of
// every trace is {"seq":0,"ev":"start","schema":kVersion}.
#pragma once

namespace tt::trace_schema {

inline constexpr int kVersion = 1;

// Event names (the "ev" field).
namespace ev {
inline constexpr char kStart[] = "start";
inline constexpr char kAlloc[] = "alloc";
inline constexpr char kFree[] = "free";
inline constexpr char kCopy[] = "copy";
inline constexpr char kWrite[] = "write";
inline constexpr char kOp[] = "op";
inline constexpr char kError[] = "error";
inline constexpr char kConvert[] = "convert"; // copy_ into another dtype
inline constexpr char kGrad[] = "grad";       // one backward node applied
inline constexpr char kRead[] = "read";       // values read to the host: item(), data_ptr, printing
} // namespace ev

// Field keys.
namespace key {
// every event
inline constexpr char kSeq[] = "seq";
inline constexpr char kEv[] = "ev";
inline constexpr char kOp[] = "op"; // the user-facing call the event happened in, or null
inline constexpr char kFile[] = "file";
inline constexpr char kLine[] = "line";
inline constexpr char kCol[] = "col";
// start
inline constexpr char kSchema[] = "schema";
// alloc, free, write
inline constexpr char kStorage[] = "storage";
inline constexpr char kBytes[] = "bytes";
inline constexpr char kDevice[] = "device";
// copy (kind: clone, contiguous, to, copy_, reshape, flatten), error (kind: error, autograd)
inline constexpr char kKind[] = "kind";
inline constexpr char kSrcStorage[] = "src_storage";
inline constexpr char kDstStorage[] = "dst_storage";
inline constexpr char kSrcTensor[] = "src_tensor";
inline constexpr char kDstTensor[] = "dst_tensor";
inline constexpr char kSrcDevice[] = "src_device"; // "cpu" / "cuda"
inline constexpr char kDstDevice[] = "dst_device";
// write
inline constexpr char kWriteOp[] = "write_op";
inline constexpr char kTensor[] = "tensor";
inline constexpr char kStorageRefs[] = "storage_refs";
inline constexpr char kHandles[] = "handles";
inline constexpr char kSum[] = "sum"; // write, op: digest of the values, CPU only
// op
inline constexpr char kName[] = "name";
inline constexpr char kInputs[] = "inputs";
inline constexpr char kInputTensors[] = "input_tensors";
inline constexpr char kOutputs[] = "outputs";
inline constexpr char kOutputTensors[] = "output_tensors";
// op: the autograd graph alive after the op (grad_fn nodes, bytes saved for backward)
inline constexpr char kGraphNodes[] = "graph_nodes";
inline constexpr char kGraphBytes[] = "graph_saved_bytes";
// error
inline constexpr char kMessage[] = "message";
// convert (with kTensor, kSum: the destination's values after the copy)
inline constexpr char kSrcDType[] = "src_dtype";
inline constexpr char kDstDType[] = "dst_dtype";
inline constexpr char kNumel[] = "numel";
inline constexpr char kChanged[] = "changed"; // elements whose value the conversion changed
inline constexpr char kSrcSum[] = "src_sum";
// grad (with kName: the node, e.g. MulBackward0): the storages of the saved
// tensors it unpacked and of the incoming gradients it read, and of the
// gradients it wrote (for AccumulateGrad and retain_grad: the .grad storage)
inline constexpr char kSaved[] = "saved";
inline constexpr char kGradsIn[] = "grads_in";
inline constexpr char kGradsOut[] = "grads_out";
// read (with kKind: item, data_ptr, print; kStorage, kTensor, kSum): the
// position of stdout when the values were read (ftell; -1 when not a file),
// so that a printed line can be traced to the values that fed it
inline constexpr char kStdoutPos[] = "stdout_pos";
} // namespace key

// Copy kinds that are implicit (the user asked for a reshape, not a copy).
inline constexpr char kCopyReshape[] = "reshape";
inline constexpr char kCopyFlatten[] = "flatten";
inline constexpr char kCopyCopyInto[] = "copy_";

// Read kinds.
inline constexpr char kReadItem[] = "item";
inline constexpr char kReadDataPtr[] = "data_ptr";
inline constexpr char kReadPrint[] = "print";

} // namespace tt::trace_schema
