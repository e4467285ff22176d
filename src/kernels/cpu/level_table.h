// Within one level: the functions that put each kernel source's entry points into the level's
// KernelTable (each defined at the end of its source), and the table itself (table.cc).
#pragma once

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/level.h"

ASTRAI_KERNELS_BEGIN

void fill_activation(KernelTable& t);
void fill_attention(KernelTable& t);
void fill_attention_backward(KernelTable& t);
void fill_cross_entropy(KernelTable& t);
void fill_embedding(KernelTable& t);
void fill_linear(KernelTable& t);
void fill_linear_backward(KernelTable& t);
void fill_peak(KernelTable& t);
void fill_rmsnorm(KernelTable& t);
void fill_rmsnorm_backward(KernelTable& t);
void fill_rope(KernelTable& t);
void fill_softmax(KernelTable& t);
void fill_swiglu_backward(KernelTable& t);

const KernelTable& table();

ASTRAI_KERNELS_END
