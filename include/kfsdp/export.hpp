#pragma once
// KFSDP_EXPORT marks a public declaration: the C++20 module `kfsdp` exports the names so marked and
// no other (scripts/module-exports reads the marks; fmt's FMT_EXPORT is the same idea). It expands to
// nothing: the module includes the headers in its global module fragment and exports the marked
// names by using-declarations, so a header build and the module see the same entities.
//
//   KFSDP_EXPORT template <class Scalar> class trainer { ... };
#define KFSDP_EXPORT
