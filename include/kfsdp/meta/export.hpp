#pragma once
// KFSDP_EXPORT marks the public API; it is `export` only while modules/kfsdp.cppm includes the
// headers (fmt's pattern), so the same headers serve `#include` and `import kfsdp;`.
#ifdef KFSDP_MODULE
#define KFSDP_EXPORT export
#else
#define KFSDP_EXPORT
#endif
