// Must NOT compile: a layer with a static zero size.
#include <kfsdp/model/layers.hpp>
kfsdp::linear<"fc", 0, 2> layer;
int main() { return 0; }
