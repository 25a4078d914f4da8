// mmq's TensorRT plugins (IPluginV3, namespace "mmq", version "1"): what TensorRT's own layers
// cannot express, over the CUDA kernels of kernels/cuda (see mmq_launch.cu). The plugins, their
// fields, inputs and outputs are those of mmq_kernels::plugin; the package's manifest.json lists
// them. Load with `trtexec --dynamicPlugins=libmmq_plugins.so` (the library exports getCreators).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <NvInferRuntime.h>

#include "mmq_launch.h"

using namespace nvinfer1;

namespace {

constexpr char const* kNamespace = "mmq";
constexpr char const* kVersion = "1";

enum class Kind { kQuantize, kDequantize, kDynamicQuantize, kMatMulNBits };

struct FieldSpec {
    char const* name;
    int32_t fallback;
};

struct PluginSpec {
    Kind kind;
    char const* name;
    std::vector<FieldSpec> fields;
    int32_t min_inputs;
    int32_t max_inputs;
    int32_t outputs;
};

std::vector<PluginSpec> const& specs() {
    static std::vector<PluginSpec> const all = {
        {Kind::kQuantize, "MmqQuantize", {{"axis", 1}, {"block_size", 0}}, 2, 3, 1},
        {Kind::kDequantize, "MmqDequantize", {{"axis", 1}, {"block_size", 0}}, 2, 3, 1},
        {Kind::kDynamicQuantize, "MmqDynamicQuantize", {{"block_size", 0}}, 1, 1, 2},
        {Kind::kMatMulNBits,
         "MmqMatMulNBits",
         {{"K", 0}, {"N", 0}, {"bits", 4}, {"block_size", 0}},
         4,
         5,
         1},
    };
    return all;
}

int64_t volume(Dims const& d) {
    int64_t v = 1;
    for (int32_t i = 0; i < d.nbDims; ++i) {
        v *= d.d[i];
    }
    return v;
}

int32_t float_type(DataType t) { return t == DataType::kHALF ? MMQ_F16 : MMQ_F32; }

class MmqPlugin : public IPluginV3,
                  public IPluginV3OneCore,
                  public IPluginV3OneBuild,
                  public IPluginV3OneRuntime {
public:
    MmqPlugin(PluginSpec const& spec, std::vector<int32_t> values)
        : mSpec(spec), mValues(std::move(values)) {
        for (size_t i = 0; i < mSpec.fields.size(); ++i) {
            mSerial.emplace_back(mSpec.fields[i].name, &mValues[i], PluginFieldType::kINT32, 1);
        }
        mSerialCollection.nbFields = static_cast<int32_t>(mSerial.size());
        mSerialCollection.fields = mSerial.data();
    }

    MmqPlugin(MmqPlugin const& other) : MmqPlugin(other.mSpec, other.mValues) {
        mInputs = other.mInputs;
    }
    MmqPlugin& operator=(MmqPlugin const&) = delete;

    int32_t field(char const* name) const {
        for (size_t i = 0; i < mSpec.fields.size(); ++i) {
            if (std::strcmp(mSpec.fields[i].name, name) == 0) {
                return mValues[i];
            }
        }
        return 0;
    }

    // IPluginV3
    IPluginCapability* getCapabilityInterface(PluginCapabilityType type) noexcept override {
        switch (type) {
            case PluginCapabilityType::kCORE:
                return static_cast<IPluginV3OneCore*>(this);
            case PluginCapabilityType::kBUILD:
                return static_cast<IPluginV3OneBuild*>(this);
            case PluginCapabilityType::kRUNTIME:
                return static_cast<IPluginV3OneRuntime*>(this);
        }
        return nullptr;
    }

    IPluginV3* clone() noexcept override {
        try {
            return new MmqPlugin(*this);
        } catch (...) {
            return nullptr;
        }
    }

    // IPluginV3OneCore
    AsciiChar const* getPluginName() const noexcept override { return mSpec.name; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    AsciiChar const* getPluginNamespace() const noexcept override { return kNamespace; }

    // IPluginV3OneBuild
    int32_t configurePlugin(DynamicPluginTensorDesc const*, int32_t nbInputs,
                            DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept override {
        mInputs = nbInputs;
        return nbInputs >= mSpec.min_inputs && nbInputs <= mSpec.max_inputs &&
                       nbOutputs == mSpec.outputs
                   ? 0
                   : -1;
    }

    int32_t getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                               DataType const* inputTypes, int32_t nbInputs) const
        noexcept override {
        if (nbOutputs != mSpec.outputs || nbInputs < mSpec.min_inputs) {
            return -1;
        }
        switch (mSpec.kind) {
            case Kind::kQuantize:
                outputTypes[0] = DataType::kINT8;
                break;
            case Kind::kDequantize:
                outputTypes[0] = DataType::kFLOAT;
                break;
            case Kind::kDynamicQuantize:
                outputTypes[0] = DataType::kINT8;
                outputTypes[1] = DataType::kFLOAT;
                break;
            case Kind::kMatMulNBits:
                outputTypes[0] = inputTypes[0];
                break;
        }
        return 0;
    }

    int32_t getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const*,
                            int32_t, DimsExprs* outputs, int32_t nbOutputs,
                            IExprBuilder& exprBuilder) noexcept override {
        if (nbInputs < mSpec.min_inputs || nbOutputs != mSpec.outputs || inputs[0].nbDims < 1) {
            return -1;
        }
        outputs[0] = inputs[0];
        int32_t last = inputs[0].nbDims - 1;
        if (mSpec.kind == Kind::kDynamicQuantize) {
            // One scale per block of the last axis (per row without a block size).
            int32_t block = field("block_size");
            outputs[1] = inputs[0];
            outputs[1].d[last] =
                block > 0 ? exprBuilder.operation(DimensionOperation::kCEIL_DIV, *inputs[0].d[last],
                                                  *exprBuilder.constant(block))
                          : exprBuilder.constant(1);
        } else if (mSpec.kind == Kind::kMatMulNBits) {
            outputs[0].d[last] = exprBuilder.constant(field("N"));
        }
        return 0;
    }

    bool supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                   int32_t nbInputs, int32_t) noexcept override {
        PluginTensorDesc const& d = inOut[pos].desc;
        if (d.format != TensorFormat::kLINEAR) {
            return false;
        }
        DataType t = d.type;
        bool floating = t == DataType::kFLOAT || t == DataType::kHALF;
        bool input = pos < nbInputs;
        int32_t out = pos - nbInputs;
        switch (mSpec.kind) {
            case Kind::kQuantize:
                return input ? (pos == 0 ? floating
                                         : (pos == 1 ? t == DataType::kFLOAT : t == DataType::kINT8))
                             : t == DataType::kINT8;
            case Kind::kDequantize:
                return input ? (pos == 1 ? t == DataType::kFLOAT : t == DataType::kINT8)
                             : t == DataType::kFLOAT;
            case Kind::kDynamicQuantize:
                return input ? floating : (out == 0 ? t == DataType::kINT8 : t == DataType::kFLOAT);
            case Kind::kMatMulNBits:
                return input && (pos == 1 || pos == 3) ? t == DataType::kUINT8
                                                       : t == DataType::kHALF;
        }
        return false;
    }

    int32_t getNbOutputs() const noexcept override { return mSpec.outputs; }

    // IPluginV3OneRuntime
    int32_t onShapeChange(PluginTensorDesc const*, int32_t nbInputs, PluginTensorDesc const*,
                          int32_t nbOutputs) noexcept override {
        mInputs = nbInputs;
        return nbInputs >= mSpec.min_inputs && nbOutputs == mSpec.outputs ? 0 : -1;
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*,
                    void const* const* inputs, void* const* outputs, void*,
                    cudaStream_t stream) noexcept override {
        Dims const& xd = inputDesc[0].dims;
        int64_t n = volume(xd);
        int64_t last = xd.nbDims > 0 ? xd.d[xd.nbDims - 1] : 1;
        switch (mSpec.kind) {
            case Kind::kQuantize:
            case Kind::kDequantize: {
                MmqScaleSpec spec = scaleSpec(xd, inputDesc[1].dims);
                if (spec.mode < 0) {
                    return -1;
                }
                auto const* scales = static_cast<float const*>(inputs[1]);
                auto const* zeros =
                    mInputs > 2 ? static_cast<int8_t const*>(inputs[2]) : nullptr;
                if (mSpec.kind == Kind::kQuantize) {
                    return mmq_launch_quantize(inputs[0], float_type(inputDesc[0].type), n, scales,
                                               zeros, spec, static_cast<int8_t*>(outputs[0]),
                                               stream);
                }
                return mmq_launch_dequantize(static_cast<int8_t const*>(inputs[0]), n, scales,
                                             zeros, spec, static_cast<float*>(outputs[0]), stream);
            }
            case Kind::kDynamicQuantize:
                if (last <= 0) {
                    return -1;
                }
                return mmq_launch_dynamic_quantize(
                    inputs[0], float_type(inputDesc[0].type), n / last, last,
                    field("block_size") > 0 ? field("block_size") : last,
                    static_cast<int8_t*>(outputs[0]), static_cast<float*>(outputs[1]), stream);
            case Kind::kMatMulNBits: {
                int64_t k = field("K");
                if (last != k || k <= 0) {
                    return -1;
                }
                void const* bias = mInputs > 4 ? inputs[4] : nullptr;
                return mmq_launch_nbits(inputs[0], static_cast<uint8_t const*>(inputs[1]),
                                        inputs[2], static_cast<uint8_t const*>(inputs[3]), bias,
                                        outputs[0], n / k, field("N"), k, field("block_size"),
                                        stream);
            }
        }
        return -1;
    }

    IPluginV3* attachToContext(IPluginResourceContext*) noexcept override { return clone(); }

    PluginFieldCollection const* getFieldsToSerialize() noexcept override {
        return &mSerialCollection;
    }

private:
    // The scale layout of data `x` with scales `s`: per tensor (one scale), in blocks along the
    // last axis (block_size > 0), or per axis; mode -1 when they do not fit.
    MmqScaleSpec scaleSpec(Dims const& x, Dims const& s) const {
        MmqScaleSpec spec{};
        if (volume(s) == 1) {
            return spec;
        }
        int32_t rank = x.nbDims;
        int32_t block = field("block_size");
        if (block > 0) {
            int32_t axis = field("axis");
            if (axis != -1 && axis != rank - 1) {
                spec.mode = -1;  // blocks along the last axis only
                return spec;
            }
            spec.mode = 2;
            spec.row_len = rank > 0 ? x.d[rank - 1] : 1;
            spec.group = block;
            return spec;
        }
        int32_t axis = field("axis");
        if (axis < 0) {
            axis += rank;
        }
        if (axis < 0 || axis >= rank) {
            spec.mode = -1;
            return spec;
        }
        spec.mode = 1;
        spec.axis_len = x.d[axis];
        spec.inner = 1;
        for (int32_t i = axis + 1; i < rank; ++i) {
            spec.inner *= x.d[i];
        }
        return spec;
    }

    PluginSpec const& mSpec;
    std::vector<int32_t> mValues;
    std::vector<PluginField> mSerial;
    PluginFieldCollection mSerialCollection{};
    int32_t mInputs{0};  // the node's inputs (MmqMatMulNBits: 5 with a bias)
};

class MmqCreator : public IPluginCreatorV3One {
public:
    explicit MmqCreator(PluginSpec const& spec) : mSpec(spec) {
        for (auto const& f : mSpec.fields) {
            mFields.emplace_back(f.name, nullptr, PluginFieldType::kINT32, 1);
        }
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
    }

    IPluginV3* createPlugin(AsciiChar const*, PluginFieldCollection const* fc,
                            TensorRTPhase) noexcept override {
        try {
            std::vector<int32_t> values;
            for (auto const& f : mSpec.fields) {
                values.push_back(f.fallback);
            }
            for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
                PluginField const& f = fc->fields[i];
                size_t at = mSpec.fields.size();
                for (size_t j = 0; j < mSpec.fields.size(); ++j) {
                    if (f.name != nullptr && std::strcmp(f.name, mSpec.fields[j].name) == 0) {
                        at = j;
                    }
                }
                if (at == mSpec.fields.size() || f.length != 1 || f.data == nullptr) {
                    return nullptr;  // not a field of this plugin
                }
                if (f.type == PluginFieldType::kINT32) {
                    values[at] = *static_cast<int32_t const*>(f.data);
                } else if (f.type == PluginFieldType::kINT64) {
                    values[at] = static_cast<int32_t>(*static_cast<int64_t const*>(f.data));
                } else {
                    return nullptr;
                }
            }
            return new MmqPlugin(mSpec, values);
        } catch (...) {
            return nullptr;
        }
    }

    PluginFieldCollection const* getFieldNames() noexcept override { return &mCollection; }
    AsciiChar const* getPluginName() const noexcept override { return mSpec.name; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    AsciiChar const* getPluginNamespace() const noexcept override { return kNamespace; }

private:
    PluginSpec const& mSpec;
    std::vector<PluginField> mFields;
    PluginFieldCollection mCollection{};
};

}  // namespace

extern "C" {

// The plugin library's entry points for TensorRT's IPluginRegistry::loadLibrary.
__attribute__((visibility("default"))) IPluginCreatorInterface* const* getCreators(
    int32_t& nbCreators) {
    static std::vector<std::unique_ptr<MmqCreator>> owned;
    static std::vector<IPluginCreatorInterface*> creators;
    if (creators.empty()) {
        for (auto const& s : specs()) {
            owned.emplace_back(new MmqCreator(s));
            creators.push_back(owned.back().get());
        }
    }
    nbCreators = static_cast<int32_t>(creators.size());
    return creators.data();
}

__attribute__((visibility("default"))) void setLoggerFinder(ILoggerFinder*) {}
}
