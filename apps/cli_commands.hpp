// The subcommands of the mamba2-ssd tool. Each takes the parsed options and returns the exit
// code; errors are thrown (UsageError: exit 2, mamba2_ssd::Error and others: exit 1).
#pragma once

#include "cli_args.hpp"

namespace cli {

// Exit codes shared by every subcommand.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;   // a failed check, or an error while running
constexpr int kExitUsage = 2;     // a bad command line, or a command that cannot run here

// mamba2-ssd run: one timed forward on random inputs, GPU when present, else the CPU reference.
int command_run(const Options& opt);

// mamba2-ssd check: the GPU forward against the float64 CPU reference on the same inputs.
int command_check(const Options& opt);

// mamba2-ssd tune: measures the kernel settings for a shape (or the benchmark's shape lists)
// and stores the fastest in the tuning cache.
int command_tune(const Options& opt);

}  // namespace cli
