// Implementation detail of reference/exact_acc.h (to be written with the numerics core).
// Required interface of ExactAcc<T> for T in {float, double}:
//   static constexpr size_t kBytes;        // == sizeof(ExactAcc<T>)
//   ExactAcc();                            // exact zero
//   void add(T x);                         // exact
//   void merge(const ExactAcc& other);     // exact, associative, commutative
//   T round() const;                       // correctly rounded, RNE
//   bool is_zero() const;
// ExactAcc<double> additionally: void add(float x) (exact widening).
#pragma once
#error "reference/exact_acc_impl.h is not written yet"
