#pragma once
// The memory-space work inside a collective, as Kokkos does it: whether the host may touch a space,
// copies, the ring's adds, scratch and staging buffers. Every step a backend takes on the bytes of
// a collective (other than the MPI or NCCL call itself) is one of these, run in the data's own
// execution space, so that a collective on Kokkos::CudaSpace never reads device memory from the
// host.
//
//   kfsdp::comm::span_in<float, Kokkos::CudaSpace> partial, own, sum;   // one ring segment
//   kfsdp::comm::detail::add(partial, own, sum);   // a kernel on Kokkos::Cuda, fenced
//
// Host memory works without Kokkos running too (a program that uses only the communicators): the
// same steps are then plain loops on the calling thread.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::comm {

// True when the host may read and write Space's memory (HostSpace, pinned and unified memory).
template <class Space>
inline constexpr bool host_accessible =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible;

// The host memory through which device memory travels for an MPI that cannot read it: pinned
// where the device backend has such a space, so the copies run at the bus's speed.
#if defined(KOKKOS_ENABLE_CUDA)
using staging_space = Kokkos::CudaHostPinnedSpace;
#else
using staging_space = Kokkos::HostSpace;
#endif

// What a scaled reduce-scatter multiplies its sums by: float for the 16-bit types, which add in float.
template <class T>
using scale_type = std::conditional_t<half_element<T>, float, T>;

namespace detail {

template <class Space>
[[nodiscard]] bool runs_as_host_loop() noexcept {
  if constexpr (host_accessible<Space>) return !Kokkos::is_initialized();
  else return false;
}

template <class T, class Space>
using unmanaged_view = Kokkos::View<T*, Space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T, class Space>
[[nodiscard]] unmanaged_view<T, Space> view_of(span_in<T, Space> elements) {
  return unmanaged_view<T, Space>(elements.data(), elements.size());
}

// to = from, element by element; the spans have equal sizes and the same space.
template <class T, class Space>
void copy(span_in<const T, Space> from, span_in<T, Space> to) {
  if (from.empty() || from.data() == to.data()) return;
  if (runs_as_host_loop<Space>()) {
    // Equal sizes; the smaller bound lets GCC see that no write passes `to` (no -Warray-bounds).
    std::copy_n(from.data(), std::min(from.size(), to.size()), to.data());
    return;
  }
  Kokkos::deep_copy(view_of(to), view_of(from));  // blocking: complete on return
}

// (a + b) · factor; a 16-bit float adds and multiplies in float and rounds once, as MPI's sum
// operation adds. For float and double the sum is rounded before the product, as two passes would:
// a factor of 1 changes no bit. (Outside the lambda below: nvcc's device lambdas take no if
// constexpr that decides what they capture.)
template <class T>
KOKKOS_INLINE_FUNCTION T scaled_sum_of(T a, T b, scale_type<T> factor) {
  if constexpr (half_element<T>) return T((a.to_float() + b.to_float()) * factor);
  else return (a + b) * factor;
}
template <class T>
KOKKOS_INLINE_FUNCTION T product_of(T a, scale_type<T> factor) {
  if constexpr (half_element<T>) return T(a.to_float() * factor);
  else return a * factor;
}

// One pass over n elements in Space's execution space (a plain loop on the host without Kokkos),
// complete on return.
template <class Space, class Body>
void for_each_index(const char* label, std::size_t n, const Body& body) {
  if (runs_as_host_loop<Space>()) {
    for (std::size_t i = 0; i < n; ++i) body(i);
    return;
  }
  using execution_space = typename Space::execution_space;
  Kokkos::parallel_for(label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::size_t>>(0, n), body);
  execution_space().fence();  // the caller sends or hands out the result next
}

// sum[i] = (partial[i] + own[i]) · factor (sum may be own or partial): the ring's step, whose last
// round folds in a scaled reduce-scatter's factor.
template <class T, class Space>
void add(span_in<const T, Space> partial, span_in<const T, Space> own, span_in<T, Space> sum,
         scale_type<T> factor = scale_type<T>(1)) {
  const T* a = partial.data();
  const T* b = own.data();
  T* out = sum.data();
  for_each_index<Space>("kfsdp::comm::add", sum.size(),
                        KOKKOS_LAMBDA(std::size_t i) { out[i] = scaled_sum_of(a[i], b[i], factor); });
}

// data[i] = data[i] · factor; nothing to do for a factor of 1.
template <class T, class Space>
void multiply(span_in<T, Space> data, scale_type<T> factor) {
  if (factor == scale_type<T>(1)) return;
  T* out = data.data();
  for_each_index<Space>("kfsdp::comm::multiply", data.size(),
                        KOKKOS_LAMBDA(std::size_t i) { out[i] = product_of(out[i], factor); });
}
// The same, enqueued on Space's default instance and not waited for (runs_on<Space>(stream)).
template <class T, class Space>
void multiply_in_stream_order(span_in<T, Space> data, scale_type<T> factor) {
  if (factor == scale_type<T>(1)) return;
  T* out = data.data();
  using execution_space = typename Space::execution_space;
  Kokkos::parallel_for("kfsdp::comm::multiply",
                       Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::size_t>>(0, data.size()),
                       KOKKOS_LAMBDA(std::size_t i) { out[i] = product_of(out[i], factor); });
}

// Elements owned in Space, e.g. a ring's receive segments: a Kokkos view, or (host memory without
// Kokkos running) a heap array. Moving it keeps data() where it was.
template <class T, class Space>
class owned_elements {
 public:
  owned_elements() = default;
  explicit owned_elements(std::size_t count) : count_(count) {
    if (runs_as_host_loop<Space>()) host_.reset(new T[count]);
    else view_ = Kokkos::View<T*, Space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::comm"), count);
  }
  [[nodiscard]] span_in<T, Space> span() const noexcept {
    return {host_ ? host_.get() : view_.data(), count_};
  }

 private:
  std::size_t count_ = 0;
  std::unique_ptr<T[]> host_;
  Kokkos::View<T*, Space> view_;
};

// to = from across memory spaces (staging device memory through host memory and back); blocks
// until done.
template <class T, class ToSpace, class FromSpace>
void transfer(span_in<T, ToSpace> to, span_in<const T, FromSpace> from) {
  if (from.empty()) return;
  if (runs_as_host_loop<ToSpace>() && runs_as_host_loop<FromSpace>()) {
    std::copy_n(from.data(), from.size(), to.data());
    return;
  }
  Kokkos::deep_copy(view_of(to), view_of(from));
}

}  // namespace detail

}  // namespace kfsdp::comm
