// Umbrella header of the mamba2-ssd C++ API.
#pragma once

#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/error.hpp"
#include "mamba2_ssd/params.hpp"
#include "mamba2_ssd/tuning.hpp"
#include "mamba2_ssd/types.hpp"
