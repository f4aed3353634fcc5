#include "engine/torch_pickle.h"

#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

// What the restricted unpickler builds: Python values as far as a state dict needs them.
struct Value;
using ValueRef = std::shared_ptr<Value>;
struct Value {
  enum Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kStorage,
    kTensor
  };
  Kind kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;                // a string; a global's "module.name"
  std::vector<ValueRef> items;  // a tuple's or list's; a dict's keys and values alternating
  TorchTensorInfo tensor;       // kTensor; kStorage fills dtype, storage and storage_numel
};

ValueRef Make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

// torch's storage types, the dtypes of their elements.
bool StorageDtype(const std::string& global, StDtype* dtype) {
  static const std::map<std::string, StDtype> kTypes = {
      {"torch.FloatStorage", StDtype::kF32}, {"torch.DoubleStorage", StDtype::kF64},
      {"torch.HalfStorage", StDtype::kF16},  {"torch.BFloat16Storage", StDtype::kBF16},
      {"torch.LongStorage", StDtype::kI64},  {"torch.IntStorage", StDtype::kI32},
      {"torch.ShortStorage", StDtype::kI16}, {"torch.CharStorage", StDtype::kI8},
      {"torch.ByteStorage", StDtype::kU8},   {"torch.BoolStorage", StDtype::kBool}};
  auto it = kTypes.find(global);
  if (it == kTypes.end()) return false;
  *dtype = it->second;
  return true;
}

class Unpickler {
 public:
  Unpickler(const std::string& data, std::string what, std::string storage_prefix)
      : data_(data), what_(std::move(what)), prefix_(std::move(storage_prefix)) {}

  absl::StatusOr<ValueRef> Run() {
    while (pos_ < data_.size()) {
      const unsigned char op = static_cast<unsigned char>(data_[pos_++]);
      if (op == '.') {  // STOP
        ASSIGN_OR_RETURN(ValueRef result, Pop());
        return result;
      }
      RETURN_IF_ERROR(Step(op));
    }
    return Bad("ends without STOP");
  }

 private:
  absl::Status Bad(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", why));
  }
  absl::StatusOr<std::string> Take(uint64_t n) {
    if (n > data_.size() - pos_) return Bad("truncated pickle");
    std::string out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  absl::StatusOr<uint64_t> Unsigned(int bytes) {
    ASSIGN_OR_RETURN(std::string b, Take(bytes));
    return LittleEndian(b, 0, bytes);
  }
  absl::StatusOr<std::string> Line() {
    const size_t end = data_.find('\n', pos_);
    if (end == std::string::npos) return Bad("truncated pickle");
    std::string out = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  absl::StatusOr<ValueRef> Pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Bad("pickle stack underflow");
    ValueRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // The values above the last MARK, which is removed.
  absl::StatusOr<std::vector<ValueRef>> PopMark() {
    if (marks_.empty()) return Bad("no MARK in the pickle");
    std::vector<ValueRef> out(stack_.begin() + marks_.back(), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return out;
  }
  absl::StatusOr<ValueRef> Top() {
    if (stack_.empty()) return Bad("pickle stack underflow");
    return stack_.back();
  }
  void Push(ValueRef v) { stack_.push_back(std::move(v)); }
  ValueRef Int(int64_t i) {
    ValueRef v = Make(Value::kInt);
    v->i = i;
    return v;
  }
  ValueRef String(std::string s, Value::Kind kind = Value::kString) {
    ValueRef v = Make(kind);
    v->s = std::move(s);
    return v;
  }
  ValueRef Tuple(std::vector<ValueRef> items) {
    ValueRef v = Make(Value::kTuple);
    v->items = std::move(items);
    return v;
  }
  absl::Status Memo(uint64_t index) {
    ASSIGN_OR_RETURN(ValueRef top, Top());
    memo_[index] = top;
    return absl::OkStatus();
  }
  absl::Status Recall(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Bad(absl::StrCat("memo entry ", index, " unset"));
    Push(it->second);
    return absl::OkStatus();
  }
  absl::Status SetItems(const ValueRef& dict, const std::vector<ValueRef>& kv) {
    if (dict->kind != Value::kDict || kv.size() % 2 != 0) return Bad("SETITEMS on a non-dict");
    dict->items.insert(dict->items.end(), kv.begin(), kv.end());
    return absl::OkStatus();
  }

  absl::Status Step(unsigned char op) {
    switch (op) {
      case 0x80:  // PROTO
        return Take(1).status();
      case 0x95:  // FRAME
        return Take(8).status();
      case '}':
        Push(Make(Value::kDict));
        return absl::OkStatus();
      case ']':
        Push(Make(Value::kList));
        return absl::OkStatus();
      case ')':
        Push(Tuple({}));
        return absl::OkStatus();
      case '(':
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case 'N':
        Push(Make(Value::kNone));
        return absl::OkStatus();
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        ValueRef v = Make(Value::kBool);
        v->i = op == 0x88;
        Push(v);
        return absl::OkStatus();
      }
      case 'K':
      case 'M': {  // BININT1, BININT2
        ASSIGN_OR_RETURN(uint64_t n, Unsigned(op == 'K' ? 1 : 2));
        Push(Int(static_cast<int64_t>(n)));
        return absl::OkStatus();
      }
      case 'J': {  // BININT
        ASSIGN_OR_RETURN(uint64_t n, Unsigned(4));
        Push(Int(static_cast<int32_t>(static_cast<uint32_t>(n))));
        return absl::OkStatus();
      }
      case 0x8a: {  // LONG1: two's complement, little-endian
        ASSIGN_OR_RETURN(uint64_t n, Unsigned(1));
        if (n > 8) return Bad("an integer wider than 64 bits");
        ASSIGN_OR_RETURN(std::string b, Take(n));
        int64_t v = 0;
        if (n > 0) {
          uint64_t u = LittleEndian(b, 0, static_cast<int>(n));
          if (n < 8 && (u >> (8 * n - 1)) != 0) u |= ~uint64_t{0} << (8 * n);  // sign-extend
          std::memcpy(&v, &u, sizeof v);
        }
        Push(Int(v));
        return absl::OkStatus();
      }
      case 'G': {  // BINFLOAT: big-endian
        ASSIGN_OR_RETURN(std::string b, Take(8));
        uint64_t u = 0;
        for (char c : b) u = (u << 8) | static_cast<unsigned char>(c);
        ValueRef v = Make(Value::kFloat);
        std::memcpy(&v->f, &u, sizeof u);
        Push(v);
        return absl::OkStatus();
      }
      case 'X':
      case 0x8c:
      case 'T':
      case 'U':
      case 'B':
      case 'C': {  // (SHORT_)BINUNICODE, (SHORT_)BINSTRING, (SHORT_)BINBYTES
        const bool short_length = op == 0x8c || op == 'U' || op == 'C';
        ASSIGN_OR_RETURN(uint64_t n, Unsigned(short_length ? 1 : 4));
        ASSIGN_OR_RETURN(std::string s, Take(n));
        Push(String(std::move(s)));
        return absl::OkStatus();
      }
      case 'c': {  // GLOBAL
        ASSIGN_OR_RETURN(std::string module, Line());
        ASSIGN_OR_RETURN(std::string name, Line());
        Push(String(absl::StrCat(module, ".", name), Value::kGlobal));
        return absl::OkStatus();
      }
      case 0x93: {  // STACK_GLOBAL
        ASSIGN_OR_RETURN(ValueRef name, Pop());
        ASSIGN_OR_RETURN(ValueRef module, Pop());
        Push(String(absl::StrCat(module->s, ".", name->s), Value::kGlobal));
        return absl::OkStatus();
      }
      case 'q':
      case 'r': {  // BINPUT, LONG_BINPUT
        ASSIGN_OR_RETURN(uint64_t index, Unsigned(op == 'q' ? 1 : 4));
        return Memo(index);
      }
      case 0x94:  // MEMOIZE
        return Memo(memo_.size());
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        ASSIGN_OR_RETURN(uint64_t index, Unsigned(op == 'h' ? 1 : 4));
        return Recall(index);
      }
      case 't': {  // TUPLE
        ASSIGN_OR_RETURN(std::vector<ValueRef> items, PopMark());
        Push(Tuple(std::move(items)));
        return absl::OkStatus();
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<ValueRef> items(op - 0x84);
        for (size_t i = items.size(); i-- > 0;) {
          ASSIGN_OR_RETURN(items[i], Pop());
        }
        Push(Tuple(std::move(items)));
        return absl::OkStatus();
      }
      case 'a': {  // APPEND
        ASSIGN_OR_RETURN(ValueRef item, Pop());
        ASSIGN_OR_RETURN(ValueRef list, Top());
        list->items.push_back(item);
        return absl::OkStatus();
      }
      case 'e': {  // APPENDS
        ASSIGN_OR_RETURN(std::vector<ValueRef> items, PopMark());
        ASSIGN_OR_RETURN(ValueRef list, Top());
        list->items.insert(list->items.end(), items.begin(), items.end());
        return absl::OkStatus();
      }
      case 's': {  // SETITEM
        ASSIGN_OR_RETURN(ValueRef value, Pop());
        ASSIGN_OR_RETURN(ValueRef key, Pop());
        ASSIGN_OR_RETURN(ValueRef dict, Top());
        return SetItems(dict, {key, value});
      }
      case 'u': {  // SETITEMS
        ASSIGN_OR_RETURN(std::vector<ValueRef> kv, PopMark());
        ASSIGN_OR_RETURN(ValueRef dict, Top());
        return SetItems(dict, kv);
      }
      case 'b':  // BUILD: the state (a state dict's _metadata) is not needed
        return Pop().status();
      case 'Q': {  // BINPERSID
        ASSIGN_OR_RETURN(ValueRef pid, Pop());
        ASSIGN_OR_RETURN(ValueRef storage, Storage(*pid));
        Push(storage);
        return absl::OkStatus();
      }
      case 'R': {  // REDUCE
        ASSIGN_OR_RETURN(ValueRef args, Pop());
        ASSIGN_OR_RETURN(ValueRef callable, Pop());
        ASSIGN_OR_RETURN(ValueRef result, Reduce(*callable, *args));
        Push(result);
        return absl::OkStatus();
      }
      default:
        return Bad(absl::StrFormat("pickle opcode 0x%02x at byte %d is not one a state dict uses",
                                   op, pos_ - 1));
    }
  }

  // ('storage', <storage type>, key, location, numel): the storage data/<key>.
  absl::StatusOr<ValueRef> Storage(const Value& pid) {
    if (pid.kind != Value::kTuple || pid.items.size() < 5 || pid.items[0]->s != "storage" ||
        pid.items[1]->kind != Value::kGlobal || pid.items[2]->kind != Value::kString ||
        pid.items[4]->kind != Value::kInt) {
      return Bad("a persistent id that is not a torch storage");
    }
    ValueRef v = Make(Value::kStorage);
    if (!StorageDtype(pid.items[1]->s, &v->tensor.dtype)) {
      return Bad(absl::StrCat("storage type ", pid.items[1]->s, " is not a numeric one"));
    }
    v->tensor.storage = absl::StrCat(prefix_, "data/", pid.items[2]->s);
    v->tensor.storage_numel = pid.items[4]->i;
    return v;
  }

  absl::StatusOr<std::vector<int64_t>> Ints(const Value& tuple, const char* what) {
    if (tuple.kind != Value::kTuple) return Bad(absl::StrCat("a tensor's ", what, " not a tuple"));
    std::vector<int64_t> out;
    for (const ValueRef& item : tuple.items) {
      if (item->kind != Value::kInt || item->i < 0) {
        return Bad(absl::StrCat("a tensor's ", what, " holds ",
                                item->kind == Value::kInt ? "a negative number" : "a non-integer"));
      }
      out.push_back(item->i);
    }
    return out;
  }

  absl::StatusOr<ValueRef> Reduce(const Value& callable, const Value& args) {
    if (callable.kind != Value::kGlobal || args.kind != Value::kTuple) {
      return Bad("REDUCE of something other than a named callable");
    }
    const std::string& name = callable.s;
    const std::vector<ValueRef>& a = args.items;
    if (name == "collections.OrderedDict") {
      if (!a.empty()) return Bad("an OrderedDict built from arguments");
      return Make(Value::kDict);
    }
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      if (a.size() < 4 || a[0]->kind != Value::kStorage || a[1]->kind != Value::kInt) {
        return Bad(absl::StrCat(name, " with arguments other than torch.save's"));
      }
      ValueRef t = Make(Value::kTensor);
      t->tensor = a[0]->tensor;
      t->tensor.storage_offset = a[1]->i;
      ASSIGN_OR_RETURN(t->tensor.shape, Ints(*a[2], "size"));
      ASSIGN_OR_RETURN(t->tensor.strides, Ints(*a[3], "stride"));
      if (t->tensor.shape.size() != t->tensor.strides.size()) {
        return Bad("a tensor whose size and stride differ in length");
      }
      return t;
    }
    if (name == "torch.jit._pickle.restore_type_tag") {  // LibTorch's typed containers
      if (a.empty()) return Bad(absl::StrCat(name, " without arguments"));
      return a[0];
    }
    if (name == "torch._utils._rebuild_parameter" ||
        name == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->kind != Value::kTensor)
        return Bad(absl::StrCat(name, " of a non-tensor"));
      return a[0];
    }
    return Bad(absl::StrCat("the pickle calls ", name,
                            ", which is not part of a plain state dict (not run)"));
  }

  const std::string& data_;
  const std::string what_;
  const std::string prefix_;
  size_t pos_ = 0;
  std::vector<ValueRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValueRef> memo_;
};

}  // namespace

int64_t TorchTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<TorchStateDict> TorchStateDict::Open(const std::string& path) {
  auto zip = ZipArchive::Open(path);
  if (absl::IsInvalidArgument(zip.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        zip.status().message(),
        " (torch.save has written zip files since torch 1.6; re-save an older file with a "
        "current torch)"));
  }
  RETURN_IF_ERROR(zip.status());
  TorchStateDict dict(*std::move(zip));
  const ZipArchive::Entry* pickle = nullptr;
  for (const ZipArchive::Entry& e : dict.zip_.entries()) {
    if (absl::EndsWith(e.name, "data.pkl") &&
        (e.name.size() == 8 || e.name.rfind('/') == e.name.size() - 9)) {
      pickle = &e;
      break;
    }
  }
  if (pickle == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no data.pkl (not a torch.save file)"));
  }
  const std::string prefix = pickle->name.substr(0, pickle->name.size() - 8);
  if (const ZipArchive::Entry* order = dict.zip_.Find(prefix + "byteorder")) {
    ASSIGN_OR_RETURN(std::string byteorder, dict.zip_.Read(*order));
    if (byteorder != "little") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": written ", byteorder, "-endian"));
    }
  }
  ASSIGN_OR_RETURN(std::string data, dict.zip_.Read(*pickle));
  Unpickler unpickler(data, absl::StrCat(path, ": data.pkl"), prefix);
  ASSIGN_OR_RETURN(ValueRef root, unpickler.Run());
  if (root->kind != Value::kDict) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds no dict of tensors (a state dict is what is read)"));
  }
  for (size_t i = 0; i + 1 < root->items.size(); i += 2) {
    const Value& key = *root->items[i];
    const Value& value = *root->items[i + 1];
    if (key.kind != Value::kString || value.kind != Value::kTensor) continue;
    TorchTensorInfo t = value.tensor;
    t.name = key.s;
    const ZipArchive::Entry* storage = dict.zip_.Find(t.storage);
    const int64_t item = StDtypeSize(t.dtype);
    if (storage == nullptr || t.storage_numel < 0 ||
        static_cast<uint64_t>(t.storage_numel) > storage->uncompressed / item) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", t.name, "'s storage ",
                                                     t.storage, " is missing or short"));
    }
    // The last element the tensor reaches, and its element count, without overflow (the sizes
    // and strides are the file's).
    int64_t last = t.storage_offset, numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      int64_t reach = 0;
      overflow |= __builtin_mul_overflow(t.shape[d], numel, &numel);
      if (t.shape[d] > 0) {
        overflow |= __builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &reach);
        overflow |= __builtin_add_overflow(last, reach, &last);
      }
    }
    if (overflow) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", t.name, " has sizes or strides out of range"));
    }
    if (numel > 0 && last >= t.storage_numel) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", t.name, " reaches element ",
                                                     last, " of a storage of ", t.storage_numel));
    }
    dict.tensors_.push_back(std::move(t));
  }
  return dict;
}

const TorchTensorInfo* TorchStateDict::Find(const std::string& name) const {
  for (const TorchTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::string> TorchStateDict::ReadStorage(const TorchTensorInfo& tensor) const {
  const ZipArchive::Entry* e = zip_.Find(tensor.storage);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(path(), " has no ", tensor.storage));
  const uint64_t bytes = static_cast<uint64_t>(tensor.storage_numel) * StDtypeSize(tensor.dtype);
  ASSIGN_OR_RETURN(std::string data, zip_.Read(*e, bytes));
  if (data.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path(), ": ", tensor.storage, " is short"));
  }
  return data;
}

absl::StatusOr<std::vector<int64_t>> TorchStateDict::ReadIntegers(const TorchTensorInfo& t) const {
  if (t.dtype != StDtype::kI64 && t.dtype != StDtype::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor ", t.name, " is not an integer tensor"));
  }
  if (t.shape.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor ", t.name, " is not 0-d or 1-d"));
  }
  ASSIGN_OR_RETURN(const std::string bytes, ReadStorage(t));
  // Open checked that every element the tensor reaches lies in its storage.
  const int64_t n = t.numel(), stride = t.strides.empty() ? 1 : t.strides[0];
  const int item = StDtypeSize(t.dtype);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const char* at = bytes.data() + (t.storage_offset + i * stride) * item;
    if (t.dtype == StDtype::kI64) {
      int64_t v;
      std::memcpy(&v, at, sizeof v);
      out.push_back(v);
    } else {
      int32_t v;
      std::memcpy(&v, at, sizeof v);
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace latentd::engine
