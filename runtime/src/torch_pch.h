// Precompiled header of edit_core: the LibTorch and c10d headers every TU needs.
#pragma once
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
