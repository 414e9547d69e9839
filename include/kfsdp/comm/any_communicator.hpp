#pragma once
// any_communicator — a communicator of any backend behind one type, so that the engine is compiled
// once (in src/fsdp/engine.cpp) instead of once per backend. Collectives are per bucket, so one virtual call
// each costs nothing next to the transfer. It refers to the communicator it wraps: that one must
// outlive it.
//
//   kfsdp::comm::mpi world;                       // or self, or nccl
//   kfsdp::comm::any_communicator comm(world);
//   kfsdp::comm::all_gather(comm, std::span<const float>(shard), std::span<float>(full));

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::comm {

class any_communicator {
 public:
  template <class C>
    requires(!std::same_as<std::remove_cvref_t<C>, any_communicator>)
  any_communicator(C& backend)  // NOLINT: implicit, so that any backend converts
      : impl_(std::make_shared<model<C>>(backend)) {}

  [[nodiscard]] int rank() const { return impl_->rank(); }
  [[nodiscard]] int size() const { return impl_->size(); }
  void barrier() { impl_->barrier(); }

  // The element types of the virtual calls below: float, double, bf16, f16. The blocking forms
  // are communicator.hpp's free functions.
  template <class T>
  [[nodiscard]] request iall_gather(std::span<const T> send, std::span<T> recv) { return impl_->iall_gather(send, recv); }
  template <class T>
  [[nodiscard]] request ireduce_scatter_sum(std::span<const T> send, std::span<T> recv) {
    return impl_->ireduce_scatter_sum(send, recv);
  }
  template <class T>
  [[nodiscard]] request ibroadcast(std::span<T> data, int root) { return impl_->ibroadcast(data, root); }
  template <class T>
  [[nodiscard]] request iall_reduce_sum(std::span<T> data) { return impl_->iall_reduce_sum(data); }

  // The agreement primitive over the wrapped backend, so that comm::check_agreement, any_rank and
  // first_rank_with take an any_communicator too.
  [[nodiscard]] value_range range_over_ranks(std::uint64_t value) { return impl_->range(value); }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual void barrier() = 0;
    virtual request iall_gather(std::span<const float>, std::span<float>) = 0;
    virtual request iall_gather(std::span<const double>, std::span<double>) = 0;
    virtual request iall_gather(std::span<const bf16>, std::span<bf16>) = 0;
    virtual request iall_gather(std::span<const f16>, std::span<f16>) = 0;
    virtual request ireduce_scatter_sum(std::span<const float>, std::span<float>) = 0;
    virtual request ireduce_scatter_sum(std::span<const double>, std::span<double>) = 0;
    virtual request ireduce_scatter_sum(std::span<const bf16>, std::span<bf16>) = 0;
    virtual request ireduce_scatter_sum(std::span<const f16>, std::span<f16>) = 0;
    virtual request ibroadcast(std::span<float>, int) = 0;
    virtual request ibroadcast(std::span<double>, int) = 0;
    virtual request ibroadcast(std::span<bf16>, int) = 0;
    virtual request ibroadcast(std::span<f16>, int) = 0;
    virtual request iall_reduce_sum(std::span<float>) = 0;
    virtual request iall_reduce_sum(std::span<double>) = 0;
    virtual request iall_reduce_sum(std::span<bf16>) = 0;
    virtual request iall_reduce_sum(std::span<f16>) = 0;
    virtual value_range range(std::uint64_t) = 0;
  };

  template <class C>
  struct model final : concept_t {
    explicit model(C& c) : backend(c) {}
    int rank() const override { return backend.rank(); }
    int size() const override { return backend.size(); }
    void barrier() override { backend.barrier(); }
    request iall_gather(std::span<const float> s, std::span<float> r) override { return backend.iall_gather(s, r); }
    request iall_gather(std::span<const double> s, std::span<double> r) override { return backend.iall_gather(s, r); }
    request iall_gather(std::span<const bf16> s, std::span<bf16> r) override { return backend.iall_gather(s, r); }
    request iall_gather(std::span<const f16> s, std::span<f16> r) override { return backend.iall_gather(s, r); }
    request ireduce_scatter_sum(std::span<const float> s, std::span<float> r) override {
      return backend.ireduce_scatter_sum(s, r);
    }
    request ireduce_scatter_sum(std::span<const double> s, std::span<double> r) override {
      return backend.ireduce_scatter_sum(s, r);
    }
    request ireduce_scatter_sum(std::span<const bf16> s, std::span<bf16> r) override {
      return backend.ireduce_scatter_sum(s, r);
    }
    request ireduce_scatter_sum(std::span<const f16> s, std::span<f16> r) override {
      return backend.ireduce_scatter_sum(s, r);
    }
    request ibroadcast(std::span<float> d, int root) override { return backend.ibroadcast(d, root); }
    request ibroadcast(std::span<double> d, int root) override { return backend.ibroadcast(d, root); }
    request ibroadcast(std::span<bf16> d, int root) override { return backend.ibroadcast(d, root); }
    request ibroadcast(std::span<f16> d, int root) override { return backend.ibroadcast(d, root); }
    request iall_reduce_sum(std::span<float> d) override { return backend.iall_reduce_sum(d); }
    request iall_reduce_sum(std::span<double> d) override { return backend.iall_reduce_sum(d); }
    request iall_reduce_sum(std::span<bf16> d) override { return backend.iall_reduce_sum(d); }
    request iall_reduce_sum(std::span<f16> d) override { return backend.iall_reduce_sum(d); }
    value_range range(std::uint64_t value) override { return kfsdp::comm::range_over_ranks(backend, value); }
    C& backend;
  };

  std::shared_ptr<concept_t> impl_;
};

}  // namespace kfsdp::comm
