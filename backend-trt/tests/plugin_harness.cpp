// A CPU harness for libmmq_plugins.so: no TensorRT library and no GPU needed. It dlopens the
// library, gets the creators through getCreators, and for every plugin instance of a spec file
// (one per line, written by the tests from a package's model.onnx):
//
//   NAME|field=value,...|input types and shapes|expected output types and shapes[|DATA]
//
// (types f32 f16 i8 u8, shapes as 2x3x4, a scalar as an empty shape, tensors separated by ';')
// creates the plugin with those fields, checks its name, version and namespace, its outputs'
// count, types and shapes (through a mock IExprBuilder on constant dims), that TensorRT's format
// query accepts the node's types, and the serialization round trip: the fields it serializes
// create an equal plugin in the runtime phase. It also checks each creator's field names against
// the `fields NAME a,b,c` lines of the spec. Prints one line per check, exits 1 on a failure.
//
// With `--enqueue` (a GPU machine) it also runs every instance that has DATA (a path prefix
// relative to the spec: DATA.in<i>.bin and DATA.out<i>.bin hold the node's operands and the
// reference interpreter's results, raw little-endian) through the plugin's enqueue on device
// buffers and compares: int8 results bit for bit, float32 within 1e-5 relative, binary16 (the
// INT4 GEMM, accumulated in another order) within 1e-2 relative. Exits 3 when there is no CUDA
// device.
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <NvInferRuntime.h>

using namespace nvinfer1;

namespace {

int failures = 0;

void check(bool ok, std::string const& what) {
    std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
    if (!ok) {
        ++failures;
    }
}

class ConstDimImpl : public apiv::VDimensionExpr {
public:
    explicit ConstDimImpl(int64_t v) : mValue(v) {}
    bool isConstant() const override { return true; }
    int64_t getConstantValue() const override { return mValue; }
    bool isSizeTensor() const override { return false; }

private:
    int64_t mValue;
};

class ConstDim : public IDimensionExpr {
public:
    explicit ConstDim(int64_t v) : mOwn(v) { mImpl = &mOwn; }
    ~ConstDim() noexcept override = default;

private:
    ConstDimImpl mOwn;
};

class MockBuilderImpl : public apiv::VExprBuilder {
public:
    IDimensionExpr const* constant(int64_t value) override {
        dims.emplace_back(value);
        return &dims.back();
    }
    IDimensionExpr const* operation(DimensionOperation op, IDimensionExpr const& a,
                                    IDimensionExpr const& b) override {
        int64_t x = a.getConstantValue();
        int64_t y = b.getConstantValue();
        int64_t r = 0;
        switch (op) {
            case DimensionOperation::kSUM: r = x + y; break;
            case DimensionOperation::kPROD: r = x * y; break;
            case DimensionOperation::kMAX: r = x > y ? x : y; break;
            case DimensionOperation::kMIN: r = x < y ? x : y; break;
            case DimensionOperation::kSUB: r = x - y; break;
            case DimensionOperation::kEQUAL: r = x == y; break;
            case DimensionOperation::kLESS: r = x < y; break;
            case DimensionOperation::kFLOOR_DIV: r = y ? x / y : 0; break;
            case DimensionOperation::kCEIL_DIV: r = y ? (x + y - 1) / y : 0; break;
        }
        return constant(r);
    }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&,
                                            IDimensionExpr const&) override {
        return nullptr;
    }
    std::deque<ConstDim> dims;
};

class MockBuilder : public IExprBuilder {
public:
    MockBuilder() { mImpl = &impl; }
    ~MockBuilder() noexcept override = default;
    MockBuilderImpl impl;
};

struct TensorSpec {
    DataType type;
    std::vector<int64_t> dims;
};

std::vector<std::string> split(std::string const& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep)) {
        out.push_back(cur);
    }
    if (!s.empty() && s.back() == sep) {
        out.emplace_back();
    }
    return out;
}

bool parse_type(std::string const& t, DataType* out) {
    static std::map<std::string, DataType> const types = {
        {"f32", DataType::kFLOAT}, {"f16", DataType::kHALF},
        {"i8", DataType::kINT8},   {"u8", DataType::kUINT8},
        {"i32", DataType::kINT32}, {"i64", DataType::kINT64}};
    auto it = types.find(t);
    if (it == types.end()) {
        return false;
    }
    *out = it->second;
    return true;
}

std::vector<TensorSpec> parse_tensors(std::string const& s) {
    std::vector<TensorSpec> out;
    if (s.empty()) {
        return out;
    }
    for (auto const& t : split(s, ';')) {
        auto parts = split(t, ':');
        TensorSpec ts{};
        if (parts.empty() || !parse_type(parts[0], &ts.type)) {
            std::fprintf(stderr, "bad tensor '%s'\n", t.c_str());
            std::exit(2);
        }
        if (parts.size() > 1 && !parts[1].empty()) {
            for (auto const& d : split(parts[1], 'x')) {
                ts.dims.push_back(std::stoll(d));
            }
        }
        out.push_back(ts);
    }
    return out;
}

std::string shape_text(DimsExprs const& d) {
    std::string s;
    for (int32_t i = 0; i < d.nbDims; ++i) {
        s += (i ? "x" : "") + std::to_string(d.d[i] ? d.d[i]->getConstantValue() : -1);
    }
    return s;
}

std::string shape_text(std::vector<int64_t> const& d) {
    std::string s;
    for (size_t i = 0; i < d.size(); ++i) {
        s += (i ? "x" : "") + std::to_string(d[i]);
    }
    return s;
}

size_t element_size(DataType t) {
    switch (t) {
        case DataType::kFLOAT:
        case DataType::kINT32:
            return 4;
        case DataType::kHALF:
            return 2;
        case DataType::kINT64:
            return 8;
        default:
            return 1;
    }
}

bool read_file(std::string const& path, std::vector<char>* out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        return false;
    }
    out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return true;
}

float half_to_float(uint16_t h) {
    uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0) {
        v = static_cast<float>(man) * (1.0f / 16777216.0f);
    } else if (exp == 31) {
        v = man ? NAN : INFINITY;
    } else {
        v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
    }
    return sign ? -v : v;
}

// Runs `plugin` through enqueue on the device with the operands DATA.in<i>.bin and compares its
// results with DATA.out<i>.bin.
void enqueue_check(IPluginV3* plugin, std::vector<TensorSpec> const& ins,
                   std::vector<TensorSpec> const& outs, std::string const& data,
                   std::string const& tag) {
    auto* rt = static_cast<IPluginV3OneRuntime*>(
        plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<PluginTensorDesc> in_desc(ins.size()), out_desc(outs.size());
    auto fill = [](PluginTensorDesc& d, TensorSpec const& t) {
        d.type = t.type;
        d.format = TensorFormat::kLINEAR;
        d.scale = -1.0f;
        d.dims.nbDims = static_cast<int32_t>(t.dims.size());
        for (size_t j = 0; j < t.dims.size(); ++j) {
            d.dims.d[j] = t.dims[j];
        }
    };
    for (size_t i = 0; i < ins.size(); ++i) {
        fill(in_desc[i], ins[i]);
    }
    for (size_t i = 0; i < outs.size(); ++i) {
        fill(out_desc[i], outs[i]);
    }
    bool ok = rt != nullptr &&
              rt->onShapeChange(in_desc.data(), static_cast<int32_t>(ins.size()), out_desc.data(),
                                static_cast<int32_t>(outs.size())) == 0;
    std::vector<void*> d_in(ins.size(), nullptr), d_out(outs.size(), nullptr);
    std::vector<std::vector<char>> want(outs.size());
    for (size_t i = 0; ok && i < ins.size(); ++i) {
        std::vector<char> bytes;
        ok = read_file(data + ".in" + std::to_string(i) + ".bin", &bytes) &&
             cudaMalloc(&d_in[i], bytes.size() + 1) == cudaSuccess &&
             cudaMemcpy(d_in[i], bytes.data(), bytes.size(), cudaMemcpyHostToDevice) ==
                 cudaSuccess;
    }
    for (size_t i = 0; ok && i < outs.size(); ++i) {
        ok = read_file(data + ".out" + std::to_string(i) + ".bin", &want[i]) &&
             cudaMalloc(&d_out[i], want[i].size() + 1) == cudaSuccess;
    }
    cudaStream_t stream = nullptr;
    ok = ok && cudaStreamCreate(&stream) == cudaSuccess;
    ok = ok && rt->enqueue(in_desc.data(), out_desc.data(), d_in.data(), d_out.data(), nullptr,
                           stream) == 0;
    ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
    check(ok, tag + ": enqueue on the device");
    for (size_t i = 0; ok && i < outs.size(); ++i) {
        std::vector<char> got(want[i].size());
        cudaMemcpy(got.data(), d_out[i], got.size(), cudaMemcpyDeviceToHost);
        size_t n = got.size() / element_size(outs[i].type), bad = 0;
        double worst = 0.0;
        for (size_t e = 0; e < n; ++e) {
            double g, w, tol;
            if (outs[i].type == DataType::kFLOAT) {
                float gf, wf;
                std::memcpy(&gf, &got[e * 4], 4);
                std::memcpy(&wf, &want[i][e * 4], 4);
                g = gf, w = wf, tol = 1e-5;
            } else if (outs[i].type == DataType::kHALF) {
                uint16_t gh, wh;
                std::memcpy(&gh, &got[e * 2], 2);
                std::memcpy(&wh, &want[i][e * 2], 2);
                g = half_to_float(gh), w = half_to_float(wh), tol = 1e-2;
            } else {
                g = static_cast<int8_t>(got[e]), w = static_cast<int8_t>(want[i][e]), tol = 0.0;
            }
            double err = std::fabs(g - w) / (1.0 + std::fabs(w));
            worst = err > worst ? err : worst;
            bad += err > tol;
        }
        check(bad == 0, tag + ": device output " + std::to_string(i) + " matches the CPU (" +
                            std::to_string(bad) + " of " + std::to_string(n) +
                            " off, worst relative " + std::to_string(worst) + ")");
    }
    for (void* p : d_in) {
        cudaFree(p);
    }
    for (void* p : d_out) {
        cudaFree(p);
    }
    if (stream) {
        cudaStreamDestroy(stream);
    }
}

std::vector<int32_t> serialized(IPluginV3* p) {
    auto* rt = static_cast<IPluginV3OneRuntime*>(
        p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<int32_t> out;
    PluginFieldCollection const* fc = rt ? rt->getFieldsToSerialize() : nullptr;
    for (int32_t i = 0; fc && i < fc->nbFields; ++i) {
        if (fc->fields[i].type == PluginFieldType::kINT32 && fc->fields[i].length == 1) {
            out.push_back(*static_cast<int32_t const*>(fc->fields[i].data));
        } else {
            out.push_back(INT32_MIN);
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    bool enqueue = argc == 4 && std::strcmp(argv[3], "--enqueue") == 0;
    if (argc != 3 && !enqueue) {
        std::fprintf(stderr, "usage: %s libmmq_plugins.so SPEC [--enqueue]\n", argv[0]);
        return 2;
    }
    if (enqueue) {
        int devices = 0;
        cudaError_t e = cudaGetDeviceCount(&devices);
        if (e != cudaSuccess || devices == 0) {
            std::printf("no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
            return 3;
        }
    }
    std::string spec_dir = argv[2];
    spec_dir = spec_dir.find('/') == std::string::npos ? "." : spec_dir.substr(0, spec_dir.rfind('/'));
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
    auto get = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
    check(get != nullptr, "getCreators is exported");
    check(dlsym(lib, "setLoggerFinder") != nullptr, "setLoggerFinder is exported");
    if (!get) {
        return 1;
    }
    int32_t count = 0;
    IPluginCreatorInterface* const* list = get(count);
    std::map<std::string, IPluginCreatorV3One*> creators;
    for (int32_t i = 0; i < count; ++i) {
        InterfaceInfo info = list[i]->getInterfaceInfo();
        bool v3 = std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0;
        check(v3, "creator " + std::to_string(i) + " is an IPluginCreatorV3One");
        if (v3) {
            auto* c = static_cast<IPluginCreatorV3One*>(list[i]);
            check(std::strcmp(c->getPluginNamespace(), "mmq") == 0 &&
                      std::strcmp(c->getPluginVersion(), "1") == 0,
                  std::string(c->getPluginName()) + ": namespace mmq, version 1");
            creators[c->getPluginName()] = c;
        }
    }
    std::ifstream spec(argv[2]);
    std::string line;
    int instances = 0;
    while (std::getline(spec, line)) {
        if (line.empty()) {
            continue;
        }
        if (line.rfind("fields ", 0) == 0) {
            auto parts = split(line.substr(7), ' ');
            std::string name = parts[0];
            std::string want = parts.size() > 1 ? parts[1] : "";
            auto it = creators.find(name);
            check(it != creators.end(), name + ": a creator exists");
            if (it == creators.end()) {
                continue;
            }
            PluginFieldCollection const* fc = it->second->getFieldNames();
            std::string got;
            for (int32_t i = 0; fc && i < fc->nbFields; ++i) {
                got += (i ? "," : "") + std::string(fc->fields[i].name);
            }
            check(got == want, name + ": fields [" + got + "] == [" + want + "]");
            continue;
        }
        auto parts = split(line, '|');
        if (parts.size() != 4 && parts.size() != 5) {
            std::fprintf(stderr, "bad spec line '%s'\n", line.c_str());
            return 2;
        }
        std::string const& name = parts[0];
        ++instances;
        std::string tag = name + " #" + std::to_string(instances);
        auto it = creators.find(name);
        check(it != creators.end(), tag + ": creator found");
        if (it == creators.end()) {
            continue;
        }
        std::deque<int32_t> values;
        std::deque<std::string> names;
        std::vector<PluginField> fields;
        for (auto const& kv : split(parts[1], ',')) {
            if (kv.empty()) {
                continue;
            }
            auto eq = kv.find('=');
            names.push_back(kv.substr(0, eq));
            values.push_back(std::stoi(kv.substr(eq + 1)));
            fields.emplace_back(names.back().c_str(), &values.back(), PluginFieldType::kINT32, 1);
        }
        PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
        IPluginV3* plugin = it->second->createPlugin(name.c_str(), &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, tag + ": created with its fields");
        if (!plugin) {
            continue;
        }
        auto* core = static_cast<IPluginV3OneCore*>(
            plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
        auto* build = static_cast<IPluginV3OneBuild*>(
            plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
        check(core && build && std::strcmp(core->getPluginName(), name.c_str()) == 0,
              tag + ": core and build capabilities");
        if (!core || !build) {
            continue;
        }
        auto ins = parse_tensors(parts[2]);
        auto outs = parse_tensors(parts[3]);
        check(build->getNbOutputs() == static_cast<int32_t>(outs.size()),
              tag + ": " + std::to_string(outs.size()) + " outputs");
        std::vector<DataType> in_types;
        for (auto const& t : ins) {
            in_types.push_back(t.type);
        }
        std::vector<DataType> out_types(outs.size(), DataType::kBOOL);
        int32_t rc = build->getOutputDataTypes(out_types.data(), static_cast<int32_t>(outs.size()),
                                               in_types.data(), static_cast<int32_t>(ins.size()));
        bool types_ok = rc == 0;
        for (size_t i = 0; i < outs.size(); ++i) {
            types_ok = types_ok && out_types[i] == outs[i].type;
        }
        check(types_ok, tag + ": output types");
        MockBuilder builder;
        std::vector<DimsExprs> in_exprs(ins.size());
        for (size_t i = 0; i < ins.size(); ++i) {
            in_exprs[i].nbDims = static_cast<int32_t>(ins[i].dims.size());
            for (size_t j = 0; j < ins[i].dims.size(); ++j) {
                in_exprs[i].d[j] = builder.constant(ins[i].dims[j]);
            }
        }
        std::vector<DimsExprs> out_exprs(outs.size());
        rc = build->getOutputShapes(in_exprs.data(), static_cast<int32_t>(ins.size()), nullptr, 0,
                                     out_exprs.data(), static_cast<int32_t>(outs.size()), builder);
        for (size_t i = 0; i < outs.size(); ++i) {
            std::string got = rc == 0 ? shape_text(out_exprs[i]) : "error";
            check(got == shape_text(outs[i].dims),
                  tag + ": output " + std::to_string(i) + " shape " + got + " (expected " +
                      shape_text(outs[i].dims) + ")");
        }
        std::vector<DynamicPluginTensorDesc> io(ins.size() + outs.size());
        for (size_t i = 0; i < io.size(); ++i) {
            TensorSpec const& t = i < ins.size() ? ins[i] : outs[i - ins.size()];
            io[i].desc.type = t.type;
            io[i].desc.format = TensorFormat::kLINEAR;
            io[i].desc.dims.nbDims = static_cast<int32_t>(t.dims.size());
            for (size_t j = 0; j < t.dims.size(); ++j) {
                io[i].desc.dims.d[j] = t.dims[j];
            }
            io[i].min = io[i].max = io[i].opt = io[i].desc.dims;
        }
        bool formats = true;
        for (size_t pos = 0; pos < io.size(); ++pos) {
            formats = formats && build->supportsFormatCombination(
                                     static_cast<int32_t>(pos), io.data(),
                                     static_cast<int32_t>(ins.size()),
                                     static_cast<int32_t>(outs.size()));
        }
        check(formats, tag + ": the node's types and linear formats are supported");
        check(build->configurePlugin(io.data(), static_cast<int32_t>(ins.size()),
                                     io.data() + ins.size(),
                                     static_cast<int32_t>(outs.size())) == 0,
              tag + ": configurePlugin");
        std::vector<int32_t> first = serialized(plugin);
        std::vector<int32_t> want(values.begin(), values.end());
        // Fields the node leaves out serialize their defaults: compare the ones it sets.
        PluginFieldCollection const* ser = static_cast<IPluginV3OneRuntime*>(
            plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME))->getFieldsToSerialize();
        bool carries = true;
        for (size_t i = 0; i < names.size(); ++i) {
            bool found = false;
            for (int32_t j = 0; ser && j < ser->nbFields; ++j) {
                if (names[i] == ser->fields[j].name) {
                    found = *static_cast<int32_t const*>(ser->fields[j].data) == values[i];
                }
            }
            carries = carries && found;
        }
        check(carries, tag + ": serializes the fields it was created with");
        IPluginV3* again = it->second->createPlugin(name.c_str(), ser, TensorRTPhase::kRUNTIME);
        check(again != nullptr && serialized(again) == first,
              tag + ": recreated from its serialized fields");
        IPluginV3* copy = plugin->clone();
        check(copy != nullptr && serialized(copy) == first, tag + ": clone");
        if (enqueue && parts.size() == 5 && again != nullptr) {
            enqueue_check(again, ins, outs, spec_dir + "/" + parts[4], tag);
        }
        delete copy;
        delete again;
        delete plugin;
    }
    check(instances > 0, "the spec names at least one plugin instance (" +
                             std::to_string(instances) + ")");
    std::printf("%d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
