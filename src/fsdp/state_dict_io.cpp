// fsdp_engine<float|double>'s state-dict IO: initialisation (every rank its own rows, or rank
// broadcast_from's values scattered), loading a full state dict, and gathering one, a parameter at
// a time. Every offset comes from the engine's shard_mapping.
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/meta/shape_string.hpp>

namespace kfsdp {

namespace {
template <class Scalar>
using host_view = Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
}  // namespace

template <class Scalar>
class fsdp_engine<Scalar>::state_dict_io {
 public:
  explicit state_dict_io(fsdp_engine& engine) : e_(engine) {}

  // Every rank fills its own real rows: fill(param, first full element, count, out); padding stays zero.
  template <class Fill>
  void fill_local(const Fill& fill) {
    const auto rank = static_cast<std::size_t>(e_.rank_);
    for (std::size_t p = 0; p < e_.table_.size(); ++p) {
      const flat_view chunk = e_.shards_.chunk(p);
      Kokkos::deep_copy(chunk, Scalar(0));
      const index_range mine = e_.map_.elements(p, rank);
      if (mine.count > 0) fill(p, mine.first, mine.count, Kokkos::subview(chunk, std::make_pair(std::size_t(0), mine.count)));
    }
    e_.context_.compute.fence();  // the shards are whole before anyone reads them
  }

  // Rank `root` fills each full parameter with fill(param, out); every rank keeps its rows. Bucket
  // by bucket: no rank ever needs room for more than one gathered bucket.
  template <class Fill>
  void scatter_from(int root, const Fill& fill) {
    const auto rank = static_cast<std::size_t>(e_.rank_);
    for (std::size_t b = 0; b < e_.plan_.buckets.size(); ++b) {
      const bucket_shard& bucket = e_.plan_.buckets[b];
      flat_view packed = e_.pool_.acquire("kfsdp::broadcast", e_.map_.gathered_numel(b));
      if (e_.rank_ == root) {
        flat_view unpacked = e_.pool_.acquire("kfsdp::broadcast_full", e_.map_.gathered_numel(b));
        for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p) {
          fill(p, Kokkos::subview(unpacked, e_.map_.unpacked(p).pair()));
          kernels::pack_param<Scalar>(unpacked, e_.map_, p, packed);
        }
        e_.comm_.order_after(e_.context_.compute);
        e_.pool_.release(unpacked);
      }
      e_.comm_.ibroadcast(span_of(packed), root).wait();
      e_.context_.bytes_communicated += packed.extent(0) * sizeof(Scalar);
      Kokkos::deep_copy(e_.shards_.bucket(b), Kokkos::subview(packed, e_.map_.rank_shard(b, rank).pair()));
      e_.pool_.release(packed);
    }
    if (e_.options_.replica_group) {  // HSDP: the first group's shards become every replica's
      e_.options_.replica_group->order_after(e_.context_.compute);
      e_.options_.replica_group->ibroadcast(span_of(e_.shards_.flat()), 0).wait();
      e_.context_.bytes_communicated += e_.shards_.bytes();
    }
  }

  // The first problem with `full` as this model's state dict, or "" when there is none.
  [[nodiscard]] std::string validate(const state_dict& full) const {
    for (const param_info& p : e_.table_) {
      const std::span<const std::size_t> expected(p.shape.data(), p.rank);
      const tensor* t = full.find(p.name.view());
      if (t == nullptr)
        return fmt::format("kfsdp::load_original_state_dict: parameter '{}' is missing (expected shape {}, dtype {})",
                           p.name.view(), shape_string(expected), io::dtype_name(dtype_of<Scalar>));
      if (!std::equal(t->shape.begin(), t->shape.end(), expected.begin(), expected.end()))
        return fmt::format("kfsdp::load_original_state_dict: parameter '{}' has shape {}, expected {}",
                           p.name.view(), shape_string(t->shape), shape_string(expected));
      if (t->type != dtype_of<Scalar>)
        return fmt::format("kfsdp::load_original_state_dict: parameter '{}' has dtype {}, expected {}",
                           p.name.view(), io::dtype_name(t->type), io::dtype_name(dtype_of<Scalar>));
      if (t->bytes.size() != p.numel * sizeof(Scalar))
        return fmt::format("kfsdp::load_original_state_dict: parameter '{}' holds {} bytes, expected {} for shape {}",
                           p.name.view(), t->bytes.size(), p.numel * sizeof(Scalar), shape_string(expected));
    }
    for (const tensor& t : full)
      if (!e_.index_.contains(t.name))
        return fmt::format("kfsdp::load_original_state_dict: '{}' (shape {}) is not a parameter of the model",
                           t.name, shape_string(t.shape));
    return {};
  }

  // Each parameter all-gathered alone; its padded chunks back to back start with the full tensor.
  [[nodiscard]] state_dict gather(const sharded_storage<Scalar>& storage, bool rank0_only) {
    const bool keep = !rank0_only || e_.rank_ == 0;
    std::vector<tensor> tensors;
    std::vector<flat_view> on_device;  // when not moving each parameter to the host at once
    e_.comm_.order_after(e_.context_.compute);  // the optimizer's or the backward's last writes
    for (std::size_t p = 0; p < e_.table_.size(); ++p) {
      flat_view gathered = e_.pool_.acquire("kfsdp::state_dict_param", e_.map_.padded_numel(p));
      e_.comm_.iall_gather(const_span_of(storage.chunk(p)), span_of(gathered)).wait();
      e_.context_.bytes_communicated += gathered.extent(0) * sizeof(Scalar);
      if (!keep) {
        e_.pool_.release(gathered);
        continue;
      }
      const param_info& info = e_.table_[p];
      tensors.push_back(tensor::zeros(std::string(info.name.view()),
                                      std::vector<std::size_t>(info.shape.begin(), info.shape.begin() + info.rank),
                                      dtype_of<Scalar>));
      if (e_.options_.move_state_dict_to_cpu) {
        copy_to_host(gathered, tensors.back());
        e_.pool_.release(gathered);
      } else {
        on_device.push_back(gathered);  // still held (and counted) until every parameter is gathered
      }
    }
    for (std::size_t i = 0; i < on_device.size(); ++i) {
      copy_to_host(on_device[i], tensors[i]);
      e_.pool_.release(on_device[i]);
    }
    return state_dict(std::move(tensors));
  }

 private:
  static void copy_to_host(const flat_view& gathered, tensor& out) {
    const auto dst = out.template values<Scalar>();
    Kokkos::deep_copy(host_view<Scalar>(dst.data(), dst.size()),
                      Kokkos::subview(gathered, std::make_pair(std::size_t(0), dst.size())));
  }

  fsdp_engine& e_;
};

template <class Scalar>
void fsdp_engine<Scalar>::initialize(std::uint64_t seed, const initializer& choose) {
  std::vector<param_init> how(table_.size());
  for (std::size_t p = 0; p < table_.size(); ++p) how[p] = choose(table_[p]);
  state_dict_io io(*this);
  if (options_.broadcast_from) {
    io.scatter_from(*options_.broadcast_from, [&](std::size_t p, flat_view out) {
      kernels::fill_init<Scalar>(out, out.extent(0), 0, seed, p, how[p]);
    });
  } else {
    io.fill_local([&](std::size_t p, std::size_t first, std::size_t count, flat_view out) {
      kernels::fill_init<Scalar>(out, count, first, seed, p, how[p]);
    });
  }
}

template <class Scalar>
void fsdp_engine<Scalar>::load_original_state_dict(const state_dict& full) {
  state_dict_io io(*this);
  const bool reads = !options_.broadcast_from || *options_.broadcast_from == rank_;
  const std::string error = reads ? io.validate(full) : std::string();
  // Every rank learns whether any rank rejected it, so none goes on into a collective alone.
  if (comm::any_rank(comm_, !error.empty())) {
    if (!error.empty()) throw std::invalid_argument(error);
    throw std::invalid_argument(
        "kfsdp::load_original_state_dict: another rank rejected its state dict (its error names the parameter); "
        "nothing was loaded");
  }
  auto host_values = [&](std::size_t p) { return full.at(table_[p].name.view()).template values<Scalar>(); };
  if (options_.broadcast_from) {
    io.scatter_from(*options_.broadcast_from, [&](std::size_t p, flat_view out) {
      const auto values = host_values(p);
      Kokkos::deep_copy(out, host_view<const Scalar>(values.data(), values.size()));
    });
  } else {
    io.fill_local([&](std::size_t p, std::size_t first, std::size_t count, flat_view out) {
      Kokkos::deep_copy(out, host_view<const Scalar>(host_values(p).data() + first, count));
    });
  }
}

template <class Scalar>
state_dict fsdp_engine<Scalar>::original_state_dict(bool rank0_only) {
  return state_dict_io(*this).gather(shards_, rank0_only);
}

template <class Scalar>
state_dict fsdp_engine<Scalar>::original_grad_dict(bool rank0_only) {
  return state_dict_io(*this).gather(grads_, rank0_only);
}

// The members defined here (the class itself is instantiated in engine.cpp).
#define KFSDP_STATE_DICT_IO(Scalar)                                                                      \
  template void fsdp_engine<Scalar>::initialize(std::uint64_t, const fsdp_engine<Scalar>::initializer&); \
  template void fsdp_engine<Scalar>::load_original_state_dict(const state_dict&);                        \
  template state_dict fsdp_engine<Scalar>::original_state_dict(bool);                                    \
  template state_dict fsdp_engine<Scalar>::original_grad_dict(bool);
KFSDP_STATE_DICT_IO(float)
KFSDP_STATE_DICT_IO(double)
#undef KFSDP_STATE_DICT_IO

}  // namespace kfsdp
