/* mo_tp: the tensor program (DESIGN §3) and the op table; the importer
 * (importer/mo_import.h) builds one from an ONNX model.
 *
 * A tensor program is what the main ONNX graph computes at the kernel level:
 * ops from the one op table, each tensor with a dtype and (where it can be
 * known) a static shape. Initializers are referenced in place. Integer shape
 * arithmetic (Constant, Shape, Gather, Concat, ... over constants) is folded at
 * import time into constant tensors, so Reshape targets, Unsqueeze axes and
 * the like are plain parameters of the op that reads them. Every TP op
 * remembers the ONNX node it came from. */
#ifndef MO_TP_H
#define MO_TP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mo_base.h"
#include "mo_onnx.h"

#define MO_MAX_RANK 8

/* How an op stands with respect to the Lax fragment (paper §5): what the
 * partitioner may put in a region and what the verifier can reason about. */
enum mo_lax {
	MO_LAX_MULTILINEAR,   /* linear in each operand: MatMul, Add, Mul, sums */
	MO_LAX_LAYOUT,        /* moves data only: Transpose, Reshape, Concat */
	MO_LAX_DIVISION,      /* Div, Reciprocal, x^-1 */
	MO_LAX_EXP,           /* one exponentiation: Exp, Sigmoid, Softmax */
	MO_LAX_COMPOSITE,     /* decomposes into the above: LayerNorm, RMSNorm */
	MO_LAX_UNINTERPRETED, /* not Lax, but element-wise or a reduction the
			       * verifier treats as a fixed random function:
			       * Sqrt, Relu, Erf, Tanh, Clip, Where, ReduceMax */
	MO_LAX_NONE,          /* a region boundary */
};

/* The op table, as an X-macro, one row per op: NAME, ONNX op_type, default
 * Lax class, exps on any path through the op, element-wise (each output
 * element depends only on the same broadcast element of each operand: what
 * a thread graph may hold), cost per output element in report FLOPs (a
 * multiply-add is two; MatMul, Gemm and the reductions are counted by
 * mo_tp_op_flops from their shapes), and the position at which the search
 * tries the op as a unary block op (0: it does not). The schema row
 * (mo_op_schema) and the element formula (tp/mo_elementwise.h, or a
 * C operator) complete an op's description; test_optable checks that every
 * stage supports every row. Every table the tool keeps per op is sized by
 * MO_OP__COUNT, so an op missing from one fails the build. */
#define MO_OP_LIST(X)                                                   \
	/* NAME        op_type                Lax class   exps ew flops unary */ \
	X(MATMUL,      "MatMul",              MULTILINEAR,   0, 0, 1, 0)        \
	X(GEMM,        "Gemm",                MULTILINEAR,   0, 0, 1, 0)        \
	X(ADD,         "Add",                 MULTILINEAR,   0, 1, 1, 0)        \
	X(SUB,         "Sub",                 MULTILINEAR,   0, 1, 1, 0)        \
	X(MUL,         "Mul",                 MULTILINEAR,   0, 1, 1, 0)        \
	X(DIV,         "Div",                 DIVISION,      0, 1, 1, 0)        \
	X(NEG,         "Neg",                 MULTILINEAR,   0, 1, 1, 0)        \
	X(RECIPROCAL,  "Reciprocal",          DIVISION,      0, 1, 1, 0)        \
	X(POW,         "Pow",                 MULTILINEAR,   0, 1, 2, 0)        \
	X(SQRT,        "Sqrt",                UNINTERPRETED, 0, 1, 1, 2)        \
	X(EXP,         "Exp",                 EXP,           1, 1, 4, 1)        \
	X(SIGMOID,     "Sigmoid",             EXP,           1, 1, 4, 3)        \
	X(SOFTMAX,     "Softmax",             EXP,           1, 0, 5, 0)        \
	X(REDUCE_SUM,  "ReduceSum",           MULTILINEAR,   0, 0, 1, 0)        \
	X(REDUCE_MEAN, "ReduceMean",          MULTILINEAR,   0, 0, 1, 0)        \
	X(REDUCE_MAX,  "ReduceMax",           UNINTERPRETED, 0, 0, 1, 0)        \
	X(LAYER_NORM,  "LayerNormalization",  COMPOSITE,     0, 0, 8, 0)        \
	X(RMS_NORM,    "RMSNormalization",    COMPOSITE,     0, 0, 5, 0)        \
	X(TRANSPOSE,   "Transpose",           LAYOUT,        0, 0, 0, 0)        \
	X(RESHAPE,     "Reshape",             LAYOUT,        0, 0, 0, 0)        \
	X(SQUEEZE,     "Squeeze",             LAYOUT,        0, 0, 0, 0)        \
	X(UNSQUEEZE,   "Unsqueeze",           LAYOUT,        0, 0, 0, 0)        \
	X(FLATTEN,     "Flatten",             LAYOUT,        0, 0, 0, 0)        \
	X(CONCAT,      "Concat",              LAYOUT,        0, 0, 0, 0)        \
	X(SPLIT,       "Split",               LAYOUT,        0, 0, 0, 0)        \
	X(SLICE,       "Slice",               LAYOUT,        0, 0, 0, 0)        \
	X(EXPAND,      "Expand",              LAYOUT,        0, 0, 0, 0)        \
	X(IDENTITY,    "Identity",            LAYOUT,        0, 1, 0, 0)        \
	X(CAST,        "Cast",                LAYOUT,        0, 1, 0, 15)       \
	X(RELU,        "Relu",                UNINTERPRETED, 0, 1, 1, 4)        \
	X(ERF,         "Erf",                 UNINTERPRETED, 0, 1, 4, 6)        \
	X(GELU,        "Gelu",                UNINTERPRETED, 0, 1, 8, 7)        \
	X(TANH,        "Tanh",                UNINTERPRETED, 0, 1, 4, 5)        \
	X(CLIP,        "Clip",                UNINTERPRETED, 0, 1, 1, 0)        \
	X(WHERE,       "Where",               UNINTERPRETED, 0, 1, 1, 0)        \
	X(MAX,         "Max",                 UNINTERPRETED, 0, 1, 1, 0)        \
	X(MIN,         "Min",                 UNINTERPRETED, 0, 1, 1, 0)        \
	X(ABS,         "Abs",                 UNINTERPRETED, 0, 1, 1, 14)       \
	X(COS,         "Cos",                 UNINTERPRETED, 0, 1, 4, 12)       \
	X(SIN,         "Sin",                 UNINTERPRETED, 0, 1, 4, 13)       \
	X(LOG,         "Log",                 UNINTERPRETED, 0, 1, 4, 11)       \
	/* comparisons of float operands and logic on their results: a bool   \
	 * tensor, held as 0 or 1 in float tiles (masks feeding a Where) */    \
	X(LESS,        "Less",                UNINTERPRETED, 0, 1, 1, 0)        \
	X(LESS_EQUAL,  "LessOrEqual",         UNINTERPRETED, 0, 1, 1, 0)        \
	X(GREATER,     "Greater",             UNINTERPRETED, 0, 1, 1, 0)        \
	X(GREATER_EQUAL, "GreaterOrEqual",    UNINTERPRETED, 0, 1, 1, 0)        \
	X(EQUAL,       "Equal",               UNINTERPRETED, 0, 1, 1, 0)        \
	X(NOT,         "Not",                 UNINTERPRETED, 0, 1, 1, 9)        \
	X(AND,         "And",                 UNINTERPRETED, 0, 1, 1, 0)        \
	X(OR,          "Or",                  UNINTERPRETED, 0, 1, 1, 0)        \
	X(IS_NAN,      "IsNaN",               UNINTERPRETED, 0, 1, 1, 10)       \
	MO_ACTIVATION_LIST(MO_ACTIVATION_AS_OP, X)                              \
	X(GATHER,      "Gather",              NONE,          0, 0, 0, 0)        \
	X(OPAQUE,      "",                    NONE,          0, 0, 0, 0)

/* The activations: element-wise, one operand, attributes alpha, beta and
 * gamma (0 where the op has none; defaults as ONNX gives them), uninterpreted
 * in the field (their seed covers the attributes), and a formula
 * mo_<formula>(x, alpha, beta, gamma) in tp/mo_elementwise.h that the
 * evaluator and the generated kernels call; the search tries each (after
 * Gelu) as a unary block op with the program's attributes. Adding one is a row here, its
 * schema row (mo_op_schema), its formula and a recipe in test_optable.
 *      NAME            op_type            flops formula         alpha     beta  gamma */
#define MO_ACTIVATION_LIST(A, X)                                                          \
	A(X, HARD_SIGMOID, "HardSigmoid",     3, hard_sigmoid,     0.2,      0.5, 0)          \
	A(X, HARD_SWISH,   "HardSwish",       4, hard_swish,       0,        0,   0)          \
	A(X, LEAKY_RELU,   "LeakyRelu",       2, leaky_relu,       0.01,     0,   0)          \
	A(X, ELU,          "Elu",             5, elu,              1,        0,   0)          \
	A(X, SELU,         "Selu",            6, selu,             1.67326319217681884765625, \
	  0, 1.05070102214813232421875)                                                    \
	A(X, CELU,         "Celu",            6, celu,             1,        0,   0)          \
	A(X, SOFTPLUS,     "Softplus",        8, softplus,         0,        0,   0)          \
	A(X, SOFTSIGN,     "Softsign",        3, softsign,         0,        0,   0)          \
	A(X, THRESHOLDED_RELU, "ThresholdedRelu", 1, thresholded_relu, 1,   0,   0)          \
	A(X, MISH,         "Mish",           12, mish,             0,        0,   0)          \
	A(X, SWISH,        "Swish",           5, swish,            1,        0,   0)
#define MO_ACTIVATION_AS_OP(X, name, onnx, flops, f, a, b, g) \
	X(name, onnx, UNINTERPRETED, 0, 1, flops, 8)
/* `case` of each op that makes a bool tensor: the comparisons and IsNaN
 * (float operands), Not, And, Or (bool operands) */
#define MO_LOGIC_CASES                                                  \
	case MO_OP_LESS: case MO_OP_LESS_EQUAL: case MO_OP_GREATER:     \
	case MO_OP_GREATER_EQUAL: case MO_OP_EQUAL: case MO_OP_NOT:     \
	case MO_OP_AND: case MO_OP_OR: case MO_OP_IS_NAN:
/* Whether op makes a bool tensor (MO_LOGIC_CASES); whether its operands
 * are bool (Not, And, Or) rather than float. */
bool mo_op_makes_bool(int op);
bool mo_op_reads_bool(int op);

/* `case MO_OP_<each activation>:` */
#define MO_ACTIVATION_CASE(X, name, onnx, flops, f, a, b, g) case MO_OP_##name:
#define MO_ACTIVATION_CASES MO_ACTIVATION_LIST(MO_ACTIVATION_CASE, _)

enum mo_op {
#define X(name, onnx, lax, exps, ew, flops, unary) MO_OP_##name,
	MO_OP_LIST(X)
#undef X
	MO_OP__COUNT
};

struct mo_op_info {
	const char *name;  /* as ONNX spells it; "" for OPAQUE */
	enum mo_lax lax;   /* the class of a typical instance */
	uint8_t exps;      /* exps on any path through the op */
	bool elementwise;
	uint8_t flops;     /* per output element, for reports */
	uint8_t search_unary; /* the search's order of unary block ops; 0: none */
};
extern const struct mo_op_info mo_op_table[MO_OP__COUNT];

/* What the tool relies on from an op's ONNX schema, one row per op: the
 * opsets it reads the op correctly at, input and output counts, attribute
 * names and types. A node outside its row is a region boundary with the
 * reason, never given a guessed meaning. */
#define MO_VARIADIC 255
struct mo_op_attr {
	const char *name;
	int type;             /* Onnx__AttributeProto__AttributeType */
	int16_t since, until; /* opsets [since, until); 0: unbounded */
};
struct mo_op_schema {
	int16_t exists;         /* first opset of ONNX that has the op */
	int16_t since;          /* first opset the tool reads the op at */
	uint8_t min_in, max_in; /* inputs below min_in are required */
	int16_t in_change;      /* before this opset, the counts below apply */
	uint8_t old_min_in, old_max_in;
	uint8_t min_out, max_out;
	struct mo_op_attr attrs[5];
	/* float types beyond ONNX's usual (float16, float, double, and bfloat16
	 * where ONNX Runtime has it): bfloat16 from this opset on (0: no
	 * constraint is checked), or float32 alone */
	int16_t bf16_since;
	bool f32_only;
};
extern const struct mo_op_schema mo_op_schema[MO_OP__COUNT];
enum mo_schema_fit {
	MO_SCHEMA_FITS,
	MO_SCHEMA_UNREAD,  /* valid ONNX the tool does not read: a boundary */
	MO_SCHEMA_INVALID, /* against ONNX's schema: ONNX Runtime refuses it */
};
/* The op of an ONNX op_type in a domain ("" or "ai.onnx"; NULL: the
 * default); MO_OP_OPAQUE for any other. */
enum mo_op mo_op_lookup(const char *domain, const char *op_type);
/* Whether node fits kind's row at opset; why not in buf. */
enum mo_schema_fit mo_op_check_node(enum mo_op kind, const Onnx__NodeProto *node,
				    int64_t opset, char *buf, size_t len);

/* ONNX ops read as an op of the table: the node becomes one TP op of
 * `kind` (nothing downstream knows it was spelled otherwise), checked
 * against its own schema row; `params` (bit i) are the inputs that are
 * parameters, not data. CastLike is a Cast to its second operand's element
 * type; Sum of two operands is their Add; ONNX Runtime's contrib ops
 * QuickGelu and FastGelu (without its bias) are Swish and Gelu. A new alias
 * needs its row in mo_op_aliases and its parameters in the importer's
 * alias_params. */
/* How a decomposed node (below) becomes ops of the table. */
enum mo_decomp {
	MO_DECOMP_NONE,
	MO_DECOMP_BIAS_GELU,  /* Gelu(x + bias): BiasGelu; FastGelu (tanh) with a bias */
	MO_DECOMP_SKIP_NORM,  /* Skip(Simplified)LayerNormalization: s = x + skip (+
			       * bias), its norm; s an output too */
	MO_DECOMP_SUM_SQUARE, /* ReduceSumSquare: ReduceSum(x·x); ReduceL2: its Sqrt */
	MO_DECOMP_SUM,        /* Sum of three or more: Adds, left to right */
	MO_DECOMP_MEAN,       /* Mean of two or more: their Adds / the count */
	MO_DECOMP_LOG_SOFTMAX, /* LogSoftmax: d = x − max(x), d − log(Σ exp(d)) */
	MO_DECOMP_LOG_SUM_EXP, /* ReduceLogSumExp: log(Σ exp(x − max(x))) + max(x) */
	MO_DECOMP_ATTENTION,  /* opset 23's Attention over 4-D heads: Softmax(Q·Kᵀ·scale
			       * (+ mask))·V */
	MO_DECOMP_PRELU,      /* PRelu: Relu(x) − slope·Relu(−x) */
	MO_DECOMP_MVN,        /* MeanVarianceNormalization: d = x − mean(x),
			       * d / (sqrt(mean(d·d)) + 1e-9) over its axes */
	MO_DECOMP_INSTANCE_NORM, /* InstanceNormalization: d = x − mean(x),
				  * d / sqrt(mean(d·d) + ε)·scale + B over the
				  * spatial dims, scale and B per channel */
	MO_DECOMP_BATCH_NORM, /* BatchNormalization (inference): (x − mean) /
			       * sqrt(var + ε)·scale + B, each per channel */
	MO_DECOMP_ROTARY,     /* opset 23's RotaryEmbedding: x1·cos − x2·sin and
			       * x1·sin + x2·cos over the rotated half-pairs */
};
struct mo_op_alias {
	const char *onnx;
	enum mo_op kind;
	unsigned params;
	struct mo_op_schema schema;
	uint8_t n_in; /* it is that op only with this many inputs (0: any);
		       * a node with another count is outside the table */
	const char *domain; /* NULL: ONNX's; else e.g. "com.microsoft" */
	double alpha; /* an activation's alpha when the node gives none (0:
		       * the op's own default) */
	/* A decomposition: the node is several ops of the table (the last
	 * being `kind`), made by the importer's decompose(); the partition
	 * keeps them together, so a region holds the whole node or none of it.
	 * epsilon: the norm's when the node gives none. */
	enum mo_decomp decomp;
	double epsilon;
};
extern const struct mo_op_alias mo_op_aliases[]; /* ends with onnx NULL */
/* The alias of op_type in domain for a node of n_in inputs; NULL: none. */
const struct mo_op_alias *mo_op_alias_lookup(const char *domain, const char *op_type, size_t n_in);
enum mo_schema_fit mo_op_check_alias(const struct mo_op_alias *a, const Onnx__NodeProto *node,
				     int64_t opset, char *buf, size_t len);
const char *mo_lax_name(enum mo_lax lax);
/* Each output element depends only on the same (broadcast) element of each
 * operand: the ops a thread graph may hold. */
bool mo_op_elementwise(enum mo_op op);

enum mo_tensor_kind {
	MO_T_INPUT,       /* a graph input */
	MO_T_INITIALIZER, /* a weight: an initializer (also one listed as input) */
	MO_T_CONST,       /* a Constant node's output or a folded value */
	MO_T_VALUE,       /* computed by a TP op */
};

struct mo_tensor {
	const char *name;
	enum mo_tensor_kind kind;
	int32_t dtype;           /* ONNX TensorProto.DataType; 0 unknown */
	bool shape_known;
	int rank;
	int64_t dims[MO_MAX_RANK];
	int producer;            /* TP op index, or -1 */
	int source_node;         /* ONNX node that made it (CONST/VALUE), or -1 */
	const Onnx__TensorProto *init; /* INITIALIZER, or CONST from a Constant node */
	int64_t *ivals;          /* values of a small integer constant, or NULL */
	double *fvals;           /* values of a small float constant, or NULL */
	size_t n_vals;
	bool is_graph_output;
	bool sized;              /* a folded value that differs at other sizes
				  * of the unbound dims (fuse/dynamic.c) */
	bool shape_told;         /* made by an op, its shape told by the graph
				  * inputs' at every size (fuse/dynamic.c): a
				  * Shape of it is made from theirs in the
				  * fused model (mo_export_options.shape_sources) */
	int n_consumers;         /* ONNX nodes reading it (inputs or subgraphs) */
	int *consumers;          /* their indices */
};

/* Gelu's attribute approximate: "none" or "tanh". */
enum mo_gelu_approx { MO_GELU_NONE, MO_GELU_TANH };

/* Per-op parameters in one fixed layout (no struct per op). Axes are
 * normalized to 0..rank-1. */
struct mo_op_params {
	int n_axes;
	int64_t axes[MO_MAX_RANK]; /* reductions, squeeze/unsqueeze, softmax
				    * and norm axis (1), concat/split/gather
				    * axis (1), transpose perm (rank) */
	int keepdims, noop_with_empty_axes;
	int trans_a, trans_b;
	double alpha, beta;        /* Gemm */
	double epsilon;            /* norms */
	double exponent;           /* Pow's constant exponent */
	bool has_exponent;
	int32_t to;                /* Cast */
	int64_t starts[MO_MAX_RANK], ends[MO_MAX_RANK], steps[MO_MAX_RANK];
				   /* Slice: per entry of axes, as written */
	const int64_t *sizes;      /* Reshape/Expand target, Split sizes */
	int n_sizes;
	int allowzero;             /* Reshape */
	enum mo_gelu_approx approximate; /* Gelu's variant */
	double clip_min, clip_max; /* Clip's constant bounds, where given */
	double gamma;              /* Selu (the activations use alpha, beta too) */
	bool has_clip_min, has_clip_max;
};

struct mo_tp_op {
	enum mo_op kind;
	enum mo_lax lax;   /* of this instance (Pow and Cast depend on it) */
	uint8_t exps;
	int node;          /* ONNX node index in the main graph */
	int n_in, n_out;
	int *in;           /* data inputs: tensor index, -1 when omitted */
	int *out;          /* tensor index, -1 when omitted */
	int n_params;      /* constant inputs folded into params */
	int *param_in;
	int n_implicit;    /* tensors its subgraphs read from the main graph */
	int *implicit;
	struct mo_op_params p;
	const char *note;  /* why the op is a boundary, if it is one */
};

/* A symbolic dimension of the graph's inputs (tp/mo_dimexpr.h) and how the
 * importer bound it; also a whole derived dim_param ("past + seq") that
 * --dim bound by its text. */
struct mo_tp_sym {
	const char *name;
	bool bound;
	bool whole_text;    /* a derived dim_param bound by its text */
	bool in_input;      /* a graph input's dims name it */
	const char *past;   /* a KV cache's new tokens (a decode step's 1):
			     * the symbol summed with it in a dim (past +
			     * sequence), alone in no output's dims while it
			     * is alone in one's; else NULL */
	int64_t value;
	const char *how;    /* "--dim", "--input-shape ids", "'a + b' = 13" */
	const char *inputs; /* the inputs whose dims name it: "ids, mask" */
};

struct mo_tp {
	struct mo_arena arena;
	const struct mo_model *model;
	int n_tensors, n_ops, n_nodes;
	struct mo_tensor *tensors;
	struct mo_tp_op *ops;       /* in topological order */
	const char **node_names;    /* stable name of every main-graph node */
	int *node_op;               /* TP op of each node, -1 if folded/constant */
	int64_t opset;              /* default-domain opset version */
	int n_inputs, n_outputs;
	int *inputs, *outputs;      /* graph inputs (not weights) and outputs */
	int n_warnings;
	const char **warnings;
	int n_syms;
	struct mo_tp_sym *syms;     /* in the order the inputs name them */
	/* some symbolic dims were given sizes by the tool, not the user (a
	 * model fused to serve every size, fuse/dynamic.c): a value folded
	 * from shapes holds at those sizes only, unless sized_known: then
	 * each such value not `sized` is the same at every size imported */
	bool sizes_chosen;
	bool sized_known;
};

/* The tensors each main-graph node made, in CSR form: node nd's are
 * made[(*at)[nd]] .. made[(*at)[nd + 1] - 1], in tensor order. False when
 * out of memory; free both with mo_free. */
bool mo_tp_node_tensors(const struct mo_tp *tp, int **at, int **made);

/* The value of a one-element weight or constant. */
bool mo_tp_scalar_value(const struct mo_tp *tp, const struct mo_tensor *t, double *v);

/* The program made of ops (indices into tp->ops, in topological order) with
 * the given inputs (activations become graph inputs; weights and constants
 * stay what they are) and outputs. Tensors keep their numbers and share
 * tp's weights and model: tp must outlive it. Free with mo_tp_free. */
enum mo_status mo_tp_region(const struct mo_tp *tp, const int *ops, int n_ops,
			    const int *inputs, int n_inputs, const int *outputs, int n_outputs,
			    struct mo_tp **out, struct mo_diag *d);
void mo_tp_free(struct mo_tp *tp);

/* Infers dtype and shape of op's outputs (tensors of tp) from its inputs and
 * params. Returns false, with *why set, when it cannot. Used by the importer
 * and by the μGraph builders for tile shapes. */
bool mo_tp_infer(struct mo_tp *tp, struct mo_tp_op *op, const char **why);
/* Slice op of operand x: per dim of x, the first element taken and the
 * step (0 and 1 where it does not slice), ONNX's negative and out-of-range
 * starts resolved: output element k along dim d is x's start[d] + k·step[d]. */
void mo_slice_walk(const struct mo_tp_op *op, const struct mo_tensor *x, int64_t *start,
		   int64_t *step);

/* a and b have the same rank and dims. */
bool mo_same_shape(const struct mo_tensor *a, const struct mo_tensor *b);

/* The reason mo_tp_infer gives for a shape too large to be a tensor: a
 * corrupt or hostile model, reported as an error rather than made a
 * boundary. */
extern const char mo_why_absurd[];

/* The output of op (its inputs' shapes known) is their numpy broadcast, of
 * dtype; false with *why when they do not broadcast. */
bool mo_tp_broadcast(struct mo_tp *tp, struct mo_tp_op *op, int32_t dtype, const char **why);

/* Sets t's shape; false if the shape is absurd (negative or overflowing). */
bool mo_tensor_set_shape(struct mo_tensor *t, int rank, const int64_t *dims);

/* x as a tensor of dtype holds it: rounded to nearest-even to float32,
 * float16 or bfloat16 (subnormals, and overflow to infinity, as IEEE
 * rounding gives them); x itself for double and other types. */
double mo_dtype_round(double x, int32_t dtype);

/* The significand bits of a float type (53, 24, 11, 8), 0 for any other. */
int mo_dtype_float_bits(int32_t dtype);

/* Whether a Cast from float type `from` to float type `to` rounds: fp16
 * and bf16 fit in fp32 and double, fp32 in double, a type in itself; every
 * other pair of float types loses bits or range (fp16 <-> bf16 both ways).
 * false when either is not a float type. */
bool mo_dtype_cast_rounds(int32_t from, int32_t to);

/* Number of elements, 0 if the shape is unknown. */
uint64_t mo_tensor_numel(const struct mo_tensor *t);
uint64_t mo_tensor_bytes(const struct mo_tensor *t);
/* Floating-point operations of one op (an estimate for reports). */
uint64_t mo_tp_op_flops(const struct mo_tp *tp, const struct mo_tp_op *op);
/* "float32 [2, 4096]" into buf. */
void mo_tensor_describe(const struct mo_tensor *t, char *buf, size_t len);

/* The tensor program as one JSON object: tensors with dtypes and shapes, ops
 * with their class and ONNX node. For tests and --dump-tp. */
void mo_tp_print_json(const struct mo_tp *tp, FILE *out);

/* JSON string escaping shared by every JSON writer of the tool. */
void mo_json_string(FILE *out, const char *s);

#endif
