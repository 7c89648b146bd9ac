// The subcommands of the `cleave` tool. Each takes the arguments after its name and returns
// the process exit status (0 ok, 1 failure, 2 bad usage).
#pragma once

namespace cleave::cli {

int runInfo(int argc, char** argv);
int runInspect(int argc, char** argv);
int runGenerate(int argc, char** argv);
int runTokenize(int argc, char** argv);
int runDetokenize(int argc, char** argv);
int runBench(int argc, char** argv);
int runBenchReport(int argc, char** argv);
int runUp(int argc, char** argv);
int runRoofline(int argc, char** argv);

}  // namespace cleave::cli
