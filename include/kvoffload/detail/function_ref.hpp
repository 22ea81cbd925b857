#pragma once

#include <type_traits>
#include <utility>

namespace kvoffload::detail {

/// A non-owning reference to a callable, so hot paths can take a predicate without the heap
/// allocation std::function may make. The referenced callable must outlive the call.
template <class Signature>
class function_ref;

template <class R, class... Args>
class function_ref<R(Args...)> {
 public:
  // Implicit, as a lambda converts; the constraint keeps copies on the copy constructor.
  // NOLINTBEGIN(google-explicit-constructor,bugprone-forwarding-reference-overload)
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, function_ref> &&
           std::is_invocable_r_v<R, F&, Args...>) function_ref(F&& f)
  noexcept
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}
  // NOLINTEND(google-explicit-constructor,bugprone-forwarding-reference-overload)

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace kvoffload::detail
