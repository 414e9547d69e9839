#pragma once
// How kfsdp's element types travel through MPI: their datatypes (bf16 and f16 as one committed
// 2-byte type), their sum operations (a user operation adding the 16-bit formats in float), and
// hindexed datatypes over pieces that lie apart in memory (sent from, or received into, where they
// lie: no packing).
//
//   detail::mpi_datatype<float>()   // MPI_FLOAT
//   detail::sum_operation<bf16>()   // a commutative MPI_Op, created on first use

#include <mpi.h>

#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/mpi/call_check.hpp>

namespace kfsdp::comm::detail {

// Setting up the 16-bit datatype or sum operation failed (MPI is not running, or out of memory):
// throws std::runtime_error naming the call.
void check_setup(int code, std::string_view mpi_call);

// bf16 and f16 travel as one 2-byte datatype, committed on first use and kept until MPI ends
// (MPI_Finalize frees it): MPI has no 16-bit float type of its own.
MPI_Datatype two_byte_datatype();

template <class T>
MPI_Datatype mpi_datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else return two_byte_datatype();  // bf16, f16
}

// One addition of the 16-bit formats: in float, rounded once to the format (half.hpp: to nearest,
// ties to even). The MPI sum operation and the ring both add this way.
template <half_element Half>
Half add_in_float(Half a, Half b) {
  return Half(a.to_float() + b.to_float());
}

// The MPI_User_function of a 16-bit sum: inout[i] = in[i] + inout[i].
template <half_element Half>
void half_sum(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const Half* addend = static_cast<const Half*>(in);
  Half* sum = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) sum[i] = add_in_float(addend[i], sum[i]);
}

// MPI_SUM for MPI's own types; a commutative user operation, created on first use, for bf16, f16.
template <class T>
MPI_Op sum_operation() {
  if constexpr (half_element<T>) {
    static const MPI_Op sum = [] {
      MPI_Op created = MPI_OP_NULL;
      check_setup(MPI_Op_create(&half_sum<T>, /*commute=*/1, &created), "MPI_Op_create");
      return created;
    }();
    return sum;
  } else {
    return MPI_SUM;
  }
}

// True when this MPI library reads and writes CUDA device memory itself (Open MPI built with
// CUDA support says so at run time); false where it cannot tell.
bool mpi_reads_device_memory();

// A committed MPI_Type_create_hindexed of T at absolute addresses (used with MPI_BOTTOM), freed
// at the end of the scope: MPI lets the operations already posted with it complete.
template <class T>
struct hindexed {
  hindexed(std::string_view function, int count, const std::vector<int>& lengths,
           const std::vector<MPI_Aint>& addresses) {
    check_mpi(MPI_Type_create_hindexed(count, lengths.data(), addresses.data(), mpi_datatype<T>(), &type),
              function, "MPI_Type_create_hindexed");
    const int committed = MPI_Type_commit(&type);
    if (committed != MPI_SUCCESS) MPI_Type_free(&type);
    check_mpi(committed, function, "MPI_Type_commit");
  }
  hindexed(const hindexed&) = delete;
  hindexed& operator=(const hindexed&) = delete;
  ~hindexed() { MPI_Type_free(&type); }
  MPI_Datatype type = MPI_DATATYPE_NULL;
};
// Where `where` lies, as MPI_BOTTOM-relative datatypes take it.
inline MPI_Aint address_of(const void* where) {
  MPI_Aint address = 0;
  MPI_Get_address(where, &address);
  return address;
}

}  // namespace kfsdp::comm::detail
